//! One sandbox and the runner inside it, as an explicit state machine.
//!
//! ```text
//!   launch ──► Ready ──execute──► Ready            (the code finished, or was interrupted in time)
//!                │
//!                ├── runner died / killed after the grace ──► Respawning ──ready──► Ready
//!                │        (the supervisor starts a new runner: variables lost, files kept)
//!                │
//!                └── protocol broken / supervisor gone ──► Down ──restart──► Ready
//!                         (a new container process: variables and workspace files lost)
//!
//!   destroy ◄── from any state ──► Destroyed
//! ```
//!
//! A sandbox dropped without `destroy` (a cancelled request) is destroyed in the background.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::backend::{
    Backend, BackendError, InputSink, OutputChunk, OutputStream, SandboxId, SandboxSpec,
};
use super::error::{Work, WorkLost};
use super::interrupt::{self, Interruption};
use super::outcome::Execution;
use super::pip::{PipAnswer, PipHandler};
use super::protocol::{
    runner_start_frames, ChangedEntry, DirEntry, FrameDecoder, LiveOutput, ProtocolError,
    RaisedException, RawRestoreReport, RawSnapshotReport, Reply, Request, RunnerExit,
};
use super::runner_set::{self, RunnerIpython};
use super::EngineError;
use crate::text::{self, truncate_chars};

/// How long the runner gets to answer a request that is not an execution.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a recycle may take to be reported (the supervisor's wipe is bounded at 2 s).
const RECYCLE_LIMIT: Duration = Duration::from_secs(8);
/// How long a sandbox gets from start to a ready runner.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The most the runner reads of a file in one request (`CHUNK_LIMIT` in its `workspace.py`).
const READ_LIMIT: u64 = 1 << 20;
/// Bytes kept of what the sandbox's processes print outside the protocol (start-up failures).
const DIAGNOSTICS_LIMIT: usize = 8 * 1024;

/// Receives an execution's output while it runs ([`Sandbox::execute_live`]).
pub type LiveOutputSink = Arc<dyn Fn(LiveOutput) + Send + Sync>;

/// Live output messages passed on per second, at most, and in a burst: the runner sends 4 a second
/// and a last one at the end; one that sends more (its code can rewrite it) is held to this.
const LIVE_PER_SECOND: f64 = 5.0;
const LIVE_BURST: f64 = 3.0;

/// Where one execution's live output goes: only messages for its request id, within the rate.
/// Messages held back by the rate are passed as one with the next one passed (or at the end), so
/// the client misses none of the text (within the bound of a message) and never goes on showing
/// what the code cleared.
struct LiveTarget {
    id: u64,
    sink: LiveOutputSink,
    tokens: f64,
    refilled: Instant,
    /// What the rate held back, not yet passed.
    held: Option<LiveOutput>,
    /// The sandbox's secrets' values, masked in stdout and stderr as they come (see
    /// [`super::redact::Stream`]).
    redact: Option<[super::redact::Stream; 2]>,
}

impl LiveTarget {
    fn pass(&mut self, output: &super::protocol::RawLiveOutput) {
        if output.id != self.id {
            return;
        }
        let now = Instant::now();
        self.tokens = (self.tokens
            + now.duration_since(self.refilled).as_secs_f64() * LIVE_PER_SECOND)
            .min(LIVE_BURST);
        self.refilled = now;
        let mut live = output.decode();
        if let Some(held) = self.held.take() {
            live = held.then(live);
        }
        if self.tokens < 1.0 {
            self.held = Some(live);
            return;
        }
        self.tokens -= 1.0;
        let live = self.redacted(live);
        (self.sink)(live);
    }

    /// The output with the secrets' values masked (a clear drops what the redaction held back:
    /// it was cleared with the rest).
    fn redacted(&mut self, live: LiveOutput) -> LiveOutput {
        let Some([stdout, stderr]) = &mut self.redact else {
            return live;
        };
        if live.cleared {
            stdout.finish();
            stderr.finish();
        }
        live.map_text(|stream, text| match stream {
            super::outcome::StreamName::Stdout => stdout.push(text),
            super::outcome::StreamName::Stderr => stderr.push(text),
        })
    }

    /// The execution is over: what the rate held back is passed now, before the result, with
    /// what the redaction held back (the start of what could have been a value).
    fn finish(mut self) {
        let held = self.held.take().map(|live| self.redacted(live));
        let mut last = held.unwrap_or_default();
        if let Some([stdout, stderr]) = &mut self.redact {
            let mut rest = LiveOutput::default();
            rest.push(super::outcome::StreamName::Stdout, &stdout.finish());
            rest.push(super::outcome::StreamName::Stderr, &stderr.finish());
            last = last.then(rest);
        }
        if last.cleared || !last.stdout.is_empty() || !last.stderr.is_empty() {
            (self.sink)(last);
        }
    }
}

/// What to execute.
#[derive(Debug, Clone, Copy)]
pub enum Task<'a> {
    /// Python source, executed in the runner's persistent namespace as a Jupyter cell: a
    /// `SystemExit` is an error, as a kernel shows it.
    Python(&'a str),
    /// Python source run as a program, as `python FILE` runs it (the CLI's `run`, the
    /// installer's scripts): a `SystemExit` is its exit status only.
    Script(&'a str),
    /// A shell command line, run with `/bin/sh -c`.
    Shell(&'a str),
}

/// A directory of the workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    pub entries: Vec<DirEntry>,
    pub truncated: bool,
    /// Why the directory could not be listed (not found, not a directory, ...).
    pub error: Option<String>,
}

/// A workspace path as the host names it to the runner: its text, and its exact bytes when they
/// are not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspacePath {
    pub text: String,
    pub raw: Option<Vec<u8>>,
}

impl WorkspacePath {
    pub fn text(path: &str) -> WorkspacePath {
        WorkspacePath {
            text: path.to_string(),
            raw: None,
        }
    }

    /// The path of a changed entry (checked by the protocol's validation).
    pub fn of(entry: &ChangedEntry) -> WorkspacePath {
        WorkspacePath {
            text: entry.path.clone(),
            raw: entry
                .path_bytes
                .as_deref()
                .and_then(|raw| base64::engine::general_purpose::STANDARD.decode(raw).ok()),
        }
    }
}

/// A piece of a workspace file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChunk {
    pub data: Vec<u8>,
    /// The file's size when the piece was read, as the sandbox said.
    pub size_hint: u64,
    /// Which file it is (`device:inode`): hard links share it.
    pub inode: String,
}

enum State {
    Ready(Runner),
    /// The runner died; the supervisor is starting a new one on the same streams.
    Respawning(Runner),
    Down(String),
    Destroyed,
}

/// What had to be restarted before a request could be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restarted {
    Nothing,
    /// A new runner (its predecessor's death was reported with the execution it ended).
    Runner,
    /// A new sandbox process tree: variables and workspace files are gone.
    Sandbox,
}

/// The host's end of the runner protocol.
struct Runner {
    input: InputSink,
    output: OutputStream,
    decoder: FrameDecoder,
    diagnostics: Vec<u8>,
    /// Set while a live execution runs; live output for anything else is dropped unread.
    live: Option<LiveTarget>,
}

/// What a runner's `ready` frame said.
struct Ready {
    python: String,
    ipython: RunnerIpython,
}

enum RunnerFailure {
    /// The supervisor reported the runner dead; it is starting a new one.
    Exited(RunnerExit),
    /// The stream ended: the sandbox's processes, supervisor included, are gone.
    Ended,
    Protocol(ProtocolError),
    Backend(BackendError),
}

impl Runner {
    async fn connect(
        streams: super::backend::RunnerStreams,
    ) -> Result<(Runner, Ready), (RunnerFailure, Vec<u8>)> {
        let mut runner = Runner {
            input: streams.input,
            output: streams.output,
            decoder: FrameDecoder::new(FrameDecoder::limit_for_output(0)),
            diagnostics: Vec::new(),
            live: None,
        };
        if let Err(e) = runner.send(&runner_start_frames()).await {
            return Err((e, runner.diagnostics));
        }
        match runner.await_ready().await {
            Ok(ready) => Ok((runner, ready)),
            Err(e) => Err((e, runner.diagnostics)),
        }
    }

    /// Waits for a (new) runner's start-up message.
    async fn await_ready(&mut self) -> Result<Ready, RunnerFailure> {
        match tokio::time::timeout(START_TIMEOUT, self.next_reply()).await {
            Ok(Ok(Reply::Ready { python, ipython })) => Ok(Ready { python, ipython }),
            Ok(Ok(_)) => Err(RunnerFailure::Protocol(ProtocolError::Malformed(
                "a reply before the runner was ready".into(),
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RunnerFailure::Backend(BackendError::Unexpected(format!(
                "the runner did not start within {}s",
                START_TIMEOUT.as_secs()
            )))),
        }
    }

    async fn send(&mut self, frame: &[u8]) -> Result<(), RunnerFailure> {
        let write = async {
            self.input.write_all(frame).await?;
            self.input.flush().await
        };
        // A dead runner cannot make a write fail promptly on every platform; the reply side notices.
        write.await.map_err(|_| RunnerFailure::Ended)
    }

    /// Reads until one complete reply is decoded; the supervisor's report of a dead runner is a
    /// failure. Live output is passed to the live execution's sink, if it is for that one, and is
    /// never a reply. Cancel-safe: a chunk is consumed only once it is in the decoder.
    async fn next_reply(&mut self) -> Result<Reply, RunnerFailure> {
        loop {
            match self.decoder.next_reply().map_err(RunnerFailure::Protocol)? {
                Some(Reply::Exited(exit)) => return Err(RunnerFailure::Exited(exit)),
                Some(Reply::Output(output)) => {
                    if let Some(live) = &mut self.live {
                        live.pass(&output);
                    }
                    continue;
                }
                Some(reply) => return Ok(reply),
                None => {}
            }
            match self.output.next().await {
                None => return Err(RunnerFailure::Ended),
                Some(Err(e)) => return Err(RunnerFailure::Backend(e)),
                Some(Ok(OutputChunk::Stdout(bytes))) => {
                    self.decoder.push(&bytes).map_err(RunnerFailure::Protocol)?
                }
                Some(Ok(OutputChunk::Stderr(bytes))) => {
                    let room = DIAGNOSTICS_LIMIT.saturating_sub(self.diagnostics.len());
                    self.diagnostics
                        .extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
            }
        }
    }
}

pub struct Sandbox {
    id: SandboxId,
    /// Directories put on the runner's `sys.path` (dependencies): put back after a restart.
    paths: Vec<String>,
    backend: Arc<dyn Backend>,
    state: State,
    next_request: u64,
    python_version: String,
    /// Whether its runner was told of the runner's IPython set (`PCS_IPYTHON`, a code sandbox):
    /// then it runs code only once its runner said it imported it (see `runner_set::check`).
    ipython_told: bool,
    /// What its runner said of its IPython when it last said it was ready.
    ipython: RunnerIpython,
    /// Its place on the egress network, when it is on it, and its adoption there (renewed when a
    /// restart gives it another address).
    attachment: Option<super::egress::Attachment>,
    egress: Option<super::egress::Lease>,
    /// Its secrets' values, masked in all that leaves it (see [`super::redact`]).
    redactor: Option<super::redact::Redactor>,
    /// Not known to be alive (it waited in the pool): the next execution checks it on the way,
    /// in the same round trip ([`Sandbox::check_on_first_execution`]).
    unverified: bool,
    /// What its container is made from: a restart makes a new one of it.
    spec: SandboxSpec,
    /// What it holds of the server's capacity (see `engine::admission`), given back when it goes.
    admitted: Option<super::admission::Admitted>,
    /// Runs it served since its start, counted when it is recycled.
    recycles: u32,
    /// `id`, for those who hold no `&Sandbox`.
    container: Container,
}

/// The container a sandbox runs in now, shared with whoever must reach it without the sandbox
/// (a session removed while it executes): a restart replaces the container.
#[derive(Debug, Clone)]
pub struct Container(Arc<std::sync::Mutex<SandboxId>>);

impl Container {
    pub fn now(&self) -> SandboxId {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, id: SandboxId) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = id;
    }
}

/// Why an execution was interrupted, if it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    None,
    Timeout,
    Cancelled,
    /// The engine said the kernel stopped a process of the sandbox for memory while the code ran
    /// (watched under gVisor, whose code is left stuck when that process is one of gVisor's own).
    OutOfMemory,
}

/// How often the engine's count of a gVisor sandbox's memory kills is looked at during an
/// execution.
const OOM_LOOK_EVERY: Duration = Duration::from_millis(250);
/// How long code whose sandbox had a memory kill gets to answer by itself (a child process of
/// its was the one killed, say) before it is taken for stuck and interrupted.
const OOM_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Resolves once the engine's count of the sandbox's memory kills passes `before`; never where
/// the engine does not count them. Under gVisor since its 2023 releases (the systrap platform)
/// the kernel's memory kill takes one of gVisor's stub processes (which gVisor marks to go
/// first), not the Sentry: the sandbox lives on, its code stuck until the time limit, and its
/// own cgroup files (gVisor's) do not show the kill.
async fn memory_killed(backend: Arc<dyn Backend>, id: SandboxId, before: Option<u64>) {
    let Some(before) = before else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(OOM_LOOK_EVERY).await;
        if backend.oom_count(&id).await.is_some_and(|now| now > before) {
            tokio::time::sleep(OOM_ANSWER_WITHIN).await;
            return;
        }
    }
}

/// The runner's request for a task.
fn request_for(task: Task<'_>, id: u64, max_output: u64, live: bool) -> Request<'_> {
    match task {
        Task::Python(code) => Request::Exec {
            id,
            code,
            max_output,
            live,
            script: false,
        },
        Task::Script(code) => Request::Exec {
            id,
            code,
            max_output,
            live,
            script: true,
        },
        Task::Shell(command) => Request::Shell {
            id,
            command,
            max_output,
            live,
        },
    }
}

/// What an execution comes to when its code ignored the interrupt and had to be killed.
fn unresponsive(
    stop: Stop,
    timeout: Duration,
    workspace_lost: bool,
    elapsed: Duration,
) -> Execution {
    let why = match stop {
        Stop::Cancelled => "Cancelled".to_string(),
        Stop::OutOfMemory => "Out of memory (the kernel stopped a process of the sandbox)".into(),
        Stop::None | Stop::Timeout => format!("Timed out after {}", text::duration(timeout)),
    };
    let what = if workspace_lost {
        "the sandbox was killed: its output, variables and workspace files are lost"
    } else {
        "its processes were killed: its output and variables are lost, the workspace files remain"
    };
    Execution {
        stderr: format!("{why}; the code did not stop on interrupt, so {what}.\n").into_bytes(),
        exit_code: 137,
        duration: elapsed,
        state_lost: true,
        workspace_lost,
        out_of_memory: stop == Stop::OutOfMemory,
        ..Default::default()
    }
}

/// How an execution's wait for its reply ended.
enum Waited {
    /// The runner did not answer the liveness check sent ahead of the code: it never read it.
    DiedBeforeUse(RunnerFailure),
    Replied(Result<Reply, RunnerFailure>),
    Interrupted(Result<Reply, RunnerFailure>),
    Unresponsive,
}

impl Sandbox {
    /// Creates and starts a sandbox and waits for its runner. On failure nothing is left behind.
    pub async fn launch(
        backend: Arc<dyn Backend>,
        spec: &SandboxSpec,
    ) -> Result<Sandbox, EngineError> {
        Self::launch_attached(backend, spec, None).await
    }

    /// [`Sandbox::launch`] on the egress network (`spec.network_name` is its name): adopted
    /// there under its address before any code runs.
    pub async fn launch_attached(
        backend: Arc<dyn Backend>,
        spec: &SandboxSpec,
        attachment: Option<super::egress::Attachment>,
    ) -> Result<Sandbox, EngineError> {
        let started = std::time::Instant::now();
        let id = Self::create(&backend, spec).await?;
        let mut sandbox = Sandbox {
            id: id.clone(),
            paths: Vec::new(),
            backend,
            state: State::Down("not started".into()),
            next_request: 0,
            python_version: String::new(),
            ipython_told: runner_set::is_named_in(&spec.env),
            ipython: RunnerIpython::Unsaid,
            redactor: attachment
                .as_ref()
                .and_then(|a| super::redact::Redactor::of(&a.secrets)),
            attachment,
            egress: None,
            unverified: false,
            spec: spec.clone(),
            admitted: None,
            recycles: 0,
            container: Container(Arc::new(std::sync::Mutex::new(id.clone()))),
        };
        match sandbox.start_runner().await {
            Ok(()) => {
                super::stats::sandbox_started(started.elapsed());
                Ok(sandbox)
            }
            Err(e) => {
                sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Its adoption on the egress network (`SANDBOX_NETWORK=allowlist`, installers).
    pub fn egress(&self) -> Option<&super::egress::Lease> {
        self.egress.as_ref()
    }

    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The roots it mounts, when it mounts any.
    pub(crate) fn mounted_roots(&self) -> Option<&Arc<super::roots::Mounted>> {
        self.spec.roots.as_ref()
    }

    /// Its container now, for those who hold no `&Sandbox`.
    pub(crate) fn container(&self) -> Container {
        self.container.clone()
    }

    /// Holds `admitted` (its share of the server's capacity) until it is dropped.
    pub(crate) fn admit(&mut self, admitted: super::admission::Admitted) {
        self.admitted = Some(admitted);
    }

    /// Times it was recycled.
    pub(crate) fn recycles(&self) -> u32 {
        self.recycles
    }

    pub fn python_version(&self) -> &str {
        &self.python_version
    }

    /// The version of IPython its runner imported, when it did.
    pub fn ipython_version(&self) -> Option<&str> {
        match &self.ipython {
            RunnerIpython::Imported(version) => Some(version),
            _ => None,
        }
    }

    async fn start_runner(&mut self) -> Result<(), EngineError> {
        let streams =
            self.backend.start(&self.id).await.map_err(|e| {
                super::error::explain_start_failure(e, self.spec.runtime.as_deref())
            })?;
        // Its mounts, before any code runs (a start with the same spec goes through this too).
        self.verify_mounts().await?;
        // Adopted on the egress network under its (possibly new) address before any code runs.
        self.adopt_on_egress().await?;
        match Runner::connect(streams).await {
            Ok((runner, ready)) => self.adopt(runner, ready).await,
            Err((failure, diagnostics)) => {
                let reason =
                    Self::describe_failure(&self.backend, &self.id, failure, &diagnostics).await;
                self.state = State::Down(reason.clone());
                Err(EngineError::SandboxStart(reason))
            }
        }
    }

    async fn adopt_on_egress(&mut self) -> Result<(), EngineError> {
        let Some(attachment) = &self.attachment else {
            return Ok(());
        };
        let address = self
            .backend
            .address_on(&self.id, &attachment.network.name)
            .await?;
        if self.egress.as_ref().is_some_and(|l| l.address() == address) {
            return Ok(());
        }
        let role = self
            .egress
            .as_ref()
            .and_then(|l| l.role())
            .unwrap_or_else(|| attachment.role.clone());
        self.egress = Some(attachment.gateway.lease(
            attachment.network.clone(),
            address,
            role,
            attachment.secrets.clone(),
        ));
        Ok(())
    }

    /// Makes a runner that just said it is ready the sandbox's runner, giving a restarted one its
    /// dependencies back. A runner told of the IPython set that did not import it is refused:
    /// no code runs there.
    async fn adopt(&mut self, mut runner: Runner, ready: Ready) -> Result<(), EngineError> {
        self.python_version = ready.python;
        self.ipython = ready.ipython;
        if let Err(why) = runner_set::check(self.ipython_told, &self.ipython) {
            tracing::warn!(sandbox = %self.id, "its runner has no IPython: {why}");
            self.state = State::Down(format!("its runner has no IPython: {why}"));
            return Err(EngineError::RunnerIpython(why));
        }
        if !self.paths.is_empty() {
            self.next_request += 1;
            let request = Request::Paths {
                id: self.next_request,
                add: &self.paths,
                remove: &[],
            };
            let restored = match runner.send(&request.to_frame()).await {
                Ok(()) => tokio::time::timeout(CONTROL_TIMEOUT, runner.next_reply())
                    .await
                    .ok(),
                Err(_) => None,
            };
            if !matches!(restored, Some(Ok(Reply::Paths { .. }))) {
                let reason = "the restarted runner did not take its dependencies";
                self.state = State::Down(reason.into());
                return Err(EngineError::SandboxStart(reason.into()));
            }
        }
        self.state = State::Ready(runner);
        Ok(())
    }

    /// Waits for the runner the supervisor is starting after a death.
    async fn respawned(&mut self, mut runner: Runner) -> Result<(), EngineError> {
        match runner.await_ready().await {
            Ok(ready) => self.adopt(runner, ready).await,
            Err(failure) => {
                let reason =
                    Self::describe_failure(&self.backend, &self.id, failure, &runner.diagnostics)
                        .await;
                // Logged by the caller, which knows whether the server itself ended the
                // sandbox meanwhile (a recycle at shutdown) or nobody expected it.
                self.state = State::Down(reason.clone());
                Err(EngineError::SandboxStart(reason))
            }
        }
    }

    /// Why a runner failed to start. Takes the backend and id rather than `&self`: a `&Sandbox`
    /// held across an await would make the future `!Send` (the attached streams are not `Sync`).
    async fn describe_failure(
        backend: &Arc<dyn Backend>,
        id: &SandboxId,
        failure: RunnerFailure,
        diagnostics: &[u8],
    ) -> String {
        let reason = match failure {
            RunnerFailure::Exited(exit) if exit.out_of_memory() => {
                "the runner ran out of memory as it started".to_string()
            }
            RunnerFailure::Exited(exit) => {
                format!(
                    "the runner exited as it started (status {})",
                    exit.exit_code()
                )
            }
            RunnerFailure::Ended => Self::why_stopped(backend, id)
                .await
                .unwrap_or_else(|e| e.to_string()),
            RunnerFailure::Protocol(e) => e.to_string(),
            RunnerFailure::Backend(e) => e.to_string(),
        };
        with_diagnostics(reason, diagnostics)
    }

    /// Replaces the sandbox's container with a new one made from the same spec (the engine
    /// removes a container whose supervisor ended, so none is started again): variables and
    /// workspace files are lost. The sandbox keeps its place (a session its id); only its
    /// container's id changes.
    pub async fn restart(&mut self) -> Result<(), EngineError> {
        if matches!(self.state, State::Destroyed) {
            return Err(EngineError::SandboxGone);
        }
        self.state = State::Down("restarting".into());
        if let Err(e) = self.backend.destroy(&self.id).await {
            tracing::warn!(sandbox = %self.id, "could not remove the container being replaced: {e}");
        }
        self.id = Self::create(&self.backend, &self.spec).await?;
        self.container.set(self.id.clone());
        self.start_runner().await
    }

    /// Creates a container of `spec`: its roots are checked first, every time (a restart too),
    /// so that each mount's path still leads, without a link, to what the host judged.
    async fn create(
        backend: &Arc<dyn Backend>,
        spec: &SandboxSpec,
    ) -> Result<SandboxId, EngineError> {
        if let Some(roots) = &spec.roots {
            roots.set.recheck().map_err(EngineError::RootChanged)?;
        }
        Ok(backend.create(spec).await?)
    }

    /// A new container's mounts of the client's roots, looked at from the host before any code
    /// runs there: each must be the directory the host judged, else the container goes (a
    /// restart's too: the sandbox is left down) and the error says which mount and why.
    async fn verify_mounts(&mut self) -> Result<(), EngineError> {
        let Some(roots) = &self.spec.roots else {
            return Ok(());
        };
        let record = self.backend.limits_record(&self.id).await;
        let outcome = match record {
            Ok(record) => {
                let gvisor = record
                    .runtime
                    .as_deref()
                    .or(self.spec.runtime.as_deref())
                    .is_some_and(super::platform::is_gvisor_name);
                super::roots::mount_holder(record.host_pid, gvisor, &self.id.0)
                    .and_then(|holder| roots.set.verify(holder))
            }
            Err(e) => Err(format!(
                "the engine does not say which process holds the sandbox ({e}), so its mounts \
                 cannot be checked"
            )),
        };
        let Err(why) = outcome else {
            return Ok(());
        };
        tracing::warn!(sandbox = %self.id, "{why}");
        if let Err(e) = self.backend.destroy(&self.id).await {
            tracing::warn!(sandbox = %self.id, "could not remove the sandbox whose mounts were refused: {e}");
        }
        self.state = State::Down(why.clone());
        Err(EngineError::RootChanged(why))
    }

    /// The sandbox waited (in the pool) and may have died meanwhile: the next execution checks
    /// it in the same round trip as the code, and fails with [`EngineError::DiedBeforeUse`] (the
    /// code not run) when it was dead.
    pub fn check_on_first_execution(&mut self) {
        self.unverified = true;
    }

    /// Executes a task with a wall-clock limit; interrupts, then kills, when it expires or when
    /// `cancel` fires.
    ///
    /// The runner is taken out of the state while it works: if this future is dropped midway, the
    /// sandbox is left `Down` (and restarts on next use) rather than with a reply in flight.
    pub async fn execute(
        &mut self,
        task: Task<'_>,
        timeout: Duration,
        max_output: u64,
        cancel: Option<&CancellationToken>,
    ) -> Result<Execution, EngineError> {
        self.execute_live(task, timeout, max_output, cancel, None, None)
            .await
    }

    /// [`execute`](Self::execute), passing the output to `live` as it comes (when given; the
    /// runner sends none otherwise; the result still carries all of it), and the code's `pip`
    /// requests to `pip` (refused without one; see [`super::pip`]).
    pub async fn execute_live(
        &mut self,
        task: Task<'_>,
        timeout: Duration,
        max_output: u64,
        cancel: Option<&CancellationToken>,
        live: Option<&LiveOutputSink>,
        pip: Option<&dyn PipHandler>,
    ) -> Result<Execution, EngineError> {
        let (mut runner, restarted) = self.take_runner("an execution was abandoned").await?;
        let probe = std::mem::take(&mut self.unverified).then(|| {
            self.next_request += 1;
            self.next_request
        });
        self.next_request += 1;
        let id = self.next_request;
        runner
            .decoder
            .set_limit(FrameDecoder::limit_for_output(max_output));
        runner.live = live.map(|sink| LiveTarget {
            id,
            sink: sink.clone(),
            tokens: LIVE_BURST,
            refilled: Instant::now(),
            held: None,
            redact: self.redactor.as_ref().map(|r| [r.stream(), r.stream()]),
        });
        let started = Instant::now();
        let (waited, stop) = self
            .await_result(
                &mut runner,
                &request_for(task, id, max_output, live.is_some()),
                probe,
                timeout,
                cancel,
                pip,
            )
            .await;
        if let Some(target) = runner.live.take() {
            target.finish();
        }
        let elapsed = started.elapsed();
        let mut execution = match waited {
            Waited::Replied(Ok(Reply::Result(raw)))
            | Waited::Interrupted(Ok(Reply::Result(raw))) => match raw.validate(id, max_output) {
                Ok(result) => {
                    self.state = State::Ready(runner);
                    Execution::from_result(result)
                }
                Err(e) => return Err(self.broken(e).await),
            },
            Waited::Replied(Ok(_)) | Waited::Interrupted(Ok(_)) => {
                let e =
                    ProtocolError::Malformed("an unexpected message instead of a result".into());
                return Err(self.broken(e).await);
            }
            Waited::Replied(Err(failure)) | Waited::Interrupted(Err(failure)) => {
                self.runner_died(runner, failure, elapsed, stop == Stop::OutOfMemory)
                    .await?
            }
            Waited::DiedBeforeUse(failure) => {
                let why = match failure {
                    RunnerFailure::Exited(_) => "its runner had exited",
                    RunnerFailure::Ended => "its processes were gone",
                    RunnerFailure::Protocol(_) => "its runner broke the protocol",
                    RunnerFailure::Backend(_) => "the engine lost its streams",
                };
                tracing::info!(sandbox = %self.id, "a pool sandbox was dead before use ({why})");
                self.state = State::Down(format!("dead before use: {why}"));
                return Err(EngineError::DiedBeforeUse);
            }
            Waited::Unresponsive => {
                tracing::info!(sandbox = %self.id, "no answer to the interrupt: killing its processes");
                let workspace_lost = !self.kill_processes(runner).await?;
                unresponsive(stop, timeout, workspace_lost, elapsed)
            }
        };
        execution.timed_out = stop == Stop::Timeout;
        execution.cancelled = stop == Stop::Cancelled;
        execution.out_of_memory |= stop == Stop::OutOfMemory;
        if restarted == Restarted::Sandbox {
            execution.state_lost = true;
            execution.workspace_lost = true;
        }
        if let Some(redactor) = &self.redactor {
            if redactor.execution(&mut execution) {
                tracing::info!(sandbox = %self.id, "a secret's value in the output was masked");
            }
        }
        Ok(execution)
    }

    /// Sends the request and waits for its result, interrupting the code when the time is up or
    /// the caller cancels, and giving it its grace ([`interrupt::grace`]) to stop. The code's `pip` requests
    /// on the way are answered ([`Sandbox::answer_pip`]); the time a handler takes counts within
    /// `timeout`, and once the code is being interrupted they are refused at once.
    ///
    /// With `probe` (the id of a liveness check), the check goes first in the same write: the
    /// runner answers it before it reads the code, so no answer means the code never ran.
    async fn await_result(
        &mut self,
        runner: &mut Runner,
        request: &Request<'_>,
        probe: Option<u64>,
        timeout: Duration,
        cancel: Option<&CancellationToken>,
        pip: Option<&dyn PipHandler>,
    ) -> (Waited, Stop) {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut frames = match probe {
            Some(id) => Request::Paths {
                id,
                add: &[],
                remove: &[],
            }
            .to_frame(),
            None => Vec::new(),
        };
        frames.extend_from_slice(&request.to_frame());
        if let Err(failure) = runner.send(&frames).await {
            return match probe {
                Some(_) => (Waited::DiedBeforeUse(failure), Stop::None),
                None => (Waited::Replied(Err(failure)), Stop::None),
            };
        }
        if let Some(probe) = probe {
            match tokio::time::timeout(CONTROL_TIMEOUT, runner.next_reply()).await {
                Ok(Ok(Reply::Paths { id, .. })) if id == probe => {}
                Ok(Ok(other)) => return (Waited::Replied(Ok(other)), Stop::None),
                Ok(Err(failure)) => return (Waited::DiedBeforeUse(failure), Stop::None),
                Err(_) => return (Waited::DiedBeforeUse(RunnerFailure::Ended), Stop::None),
            }
        }
        let sent = started.elapsed();
        let never = CancellationToken::new();
        let cancel = cancel.unwrap_or(&never);
        let execution = request.id();
        let mut asked = 0;
        let oom_before = if self.gvisor() {
            self.backend.oom_count(&self.id).await
        } else {
            None
        };
        let oom = memory_killed(self.backend.clone(), self.id.clone(), oom_before);
        tokio::pin!(oom);
        let stop = loop {
            // next_reply is cancel-safe: a reply is never lost to the timer.
            let reply = tokio::select! {
                r = runner.next_reply() => r,
                () = tokio::time::sleep_until(deadline) => break Stop::Timeout,
                () = cancel.cancelled() => break Stop::Cancelled,
                () = &mut oom => break Stop::OutOfMemory,
            };
            match reply {
                Ok(Reply::Pip { id, line }) => {
                    let handler = pip.map(|p| (p, deadline.into_std()));
                    if let Err(failure) = self
                        .answer_pip(runner, execution, id, &line, &mut asked, handler)
                        .await
                    {
                        return (Waited::Replied(Err(failure)), Stop::None);
                    }
                }
                r => {
                    self.log_timing(started, sent);
                    return (Waited::Replied(r), Stop::None);
                }
            }
        };
        tracing::debug!(sandbox = %self.id, "{stop:?}: interrupting");
        let mut interruption = self.interrupt().await;
        let waited = loop {
            let Some(reply) = interruption.within(runner.next_reply()).await else {
                break Waited::Unresponsive;
            };
            match reply {
                Ok(Reply::Pip { id, line }) => {
                    // No handler: the call is ending.
                    if let Err(failure) = self
                        .answer_pip(runner, execution, id, &line, &mut asked, None)
                        .await
                    {
                        break Waited::Interrupted(Err(failure));
                    }
                }
                r => break Waited::Interrupted(r),
            }
        };
        self.log_timing(started, sent);
        (waited, stop)
    }

    /// Answers one `pip` request of the code's: refused unless it is admitted
    /// ([`super::pip::admit`]) and there is a handler, else the handler's answer; the sets the
    /// answer puts on (or takes off) `sys.path` are remembered like [`Sandbox::add_paths`]'s, so a
    /// restarted runner gets them back.
    async fn answer_pip(
        &mut self,
        runner: &mut Runner,
        execution: u64,
        id: u64,
        line: &str,
        asked: &mut usize,
        handler: Option<(&dyn PipHandler, Instant)>,
    ) -> Result<(), RunnerFailure> {
        let answer = match (super::pip::admit(execution, id, line, *asked), handler) {
            (Err(refusal), _) => refusal,
            (Ok(()), None) => {
                *asked += 1;
                PipAnswer::refused("pip: packages cannot be installed here now")
            }
            (Ok(()), Some((handler, deadline))) => {
                *asked += 1;
                handler.handle(line, deadline).await
            }
        };
        if answer.ok {
            self.paths.retain(|p| !answer.remove.contains(p));
            for path in &answer.add {
                if !self.paths.contains(path) {
                    self.paths.push(path.clone());
                }
            }
        }
        runner.send(&answer.frame(id)).await
    }

    /// Whether its code runs under gVisor.
    fn gvisor(&self) -> bool {
        self.spec
            .runtime
            .as_deref()
            .is_some_and(super::platform::is_gvisor_name)
    }

    /// How long its code gets to answer an interrupt: longer under gVisor.
    fn interrupt_grace(&self) -> Duration {
        interrupt::grace(self.spec.runtime.as_deref())
    }

    /// Interrupts its code, with the grace of its runtime (the future holds no borrow of the
    /// sandbox, which is not `Sync`).
    fn interrupt(&self) -> impl std::future::Future<Output = Interruption> + Send + 'static {
        Interruption::start(
            self.backend.clone(),
            self.id.clone(),
            self.interrupt_grace(),
        )
    }

    fn log_timing(&self, started: Instant, sent: Duration) {
        let elapsed = started.elapsed();
        tracing::debug!(
            sandbox = %self.id,
            send_ms = sent.as_secs_f64() * 1000.0,
            reply_ms = (elapsed - sent).as_secs_f64() * 1000.0,
            "execution"
        );
    }

    /// Has the supervisor kill every process but itself, and waits for its report. Returns
    /// whether that worked (the sandbox is then respawning its runner, workspace intact); if it
    /// did not, the whole sandbox is killed and is `Down`.
    async fn kill_processes(&mut self, mut runner: Runner) -> Result<bool, EngineError> {
        let reported = match self.backend.kill_processes(&self.id).await {
            Err(e) => {
                tracing::warn!(sandbox = %self.id, "could not signal the supervisor: {e}");
                false
            }
            Ok(()) => {
                let death = async {
                    loop {
                        match runner.next_reply().await {
                            Err(RunnerFailure::Exited(_)) => return true,
                            Ok(_) => continue, // a reply sent just before the kill
                            Err(_) => return false,
                        }
                    }
                };
                tokio::time::timeout(self.interrupt_grace() * 2, death)
                    .await
                    .unwrap_or(false)
            }
        };
        if reported {
            self.state = State::Respawning(runner);
            return Ok(true);
        }
        tracing::warn!(sandbox = %self.id, "the supervisor did not report: killing the sandbox");
        self.state = State::Down("killed after an unanswered interrupt".into());
        self.backend.kill(&self.id).await?;
        Ok(false)
    }

    /// The runner, taken out of the state for a request (restarted first if it is down; the
    /// second value says so). Until it is put back the sandbox counts as down, so a request
    /// abandoned midway leaves it restarting on next use rather than with a reply in flight.
    async fn take_runner(&mut self, abandoned: &str) -> Result<(Runner, Restarted), EngineError> {
        let mut restarted = match std::mem::replace(&mut self.state, State::Down(abandoned.into()))
        {
            State::Respawning(runner) => {
                if let Err(e) = self.respawned(runner).await {
                    tracing::warn!(sandbox = %self.id, "no new runner after a death, falling back to a full restart: {e}");
                }
                Restarted::Runner
            }
            other => {
                self.state = other;
                Restarted::Nothing
            }
        };
        if let State::Down(reason) = &self.state {
            tracing::info!(sandbox = %self.id, "restarting a sandbox that is down ({reason})");
            self.restart().await?;
            restarted = Restarted::Sandbox;
        }
        match std::mem::replace(&mut self.state, State::Down(abandoned.into())) {
            State::Ready(runner) => Ok((runner, restarted)),
            other => {
                self.state = other;
                Err(EngineError::SandboxGone)
            }
        }
    }

    /// Lists a directory of the workspace through the runner (never following links).
    pub async fn list(&mut self, path: &str) -> Result<Listing, EngineError> {
        match self.control(|id| Request::List { id, path }).await? {
            Reply::Listing(listing) if listing.entries.len() <= 1000 => {
                let entries = listing
                    .entries
                    .into_iter()
                    .filter(|e| {
                        !e.name.is_empty()
                            && !e.name.contains('/')
                            && e.name != "."
                            && e.name != ".."
                    })
                    .map(|e| DirEntry {
                        name: truncate_chars(&e.name, 255),
                        kind: truncate_chars(&e.kind, 16),
                        size: e.size,
                    })
                    .collect();
                let mut listing = Listing {
                    entries,
                    truncated: listing.truncated,
                    error: listing.error.map(|e| truncate_chars(&e, 500)),
                };
                if let Some(redactor) = &self.redactor {
                    for entry in &mut listing.entries {
                        redactor.text(&mut entry.name);
                    }
                    if let Some(error) = &mut listing.error {
                        redactor.text(error);
                    }
                }
                Ok(listing)
            }
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a listing".into(),
                ))
                .await),
        }
    }

    /// Reads at most `length` bytes of a workspace file from `offset`, as the sandbox's user and
    /// without following links. `Ok(Err(reason))`: the file cannot be read (a link, a directory,
    /// permission denied, gone); `Err`: the sandbox failed.
    /// With secrets, the piece is masked as the whole file would be (see [`super::redact`]): it
    /// is read with the bytes around it a value could reach into.
    pub async fn read_chunk(
        &mut self,
        path: &WorkspacePath,
        offset: u64,
        length: u64,
    ) -> Result<Result<FileChunk, String>, EngineError> {
        let Some(redactor) = self.redactor.clone() else {
            return self.read_raw(path, offset, length).await;
        };
        let (start, wide, at) = redactor.widened(offset, length);
        // In pieces the runner serves whole (it reads at most READ_LIMIT at once), up to the end.
        let mut chunk: Option<FileChunk> = None;
        let mut read = 0u64;
        while read < wide {
            let want = (wide - read).min(READ_LIMIT);
            let piece = match self.read_raw(path, start + read, want).await? {
                Ok(piece) => piece,
                Err(reason) => return Ok(Err(reason)),
            };
            let short = (piece.data.len() as u64) < want;
            read += piece.data.len() as u64;
            match &mut chunk {
                None => chunk = Some(piece),
                Some(chunk) if chunk.inode != piece.inode => {
                    return Ok(Err("the file was replaced while it was being read".into()))
                }
                Some(chunk) => chunk.data.extend_from_slice(&piece.data),
            }
            if short {
                break;
            }
        }
        let Some(mut chunk) = chunk else {
            return self.read_raw(path, offset, 0).await;
        };
        if redactor.bytes(&mut chunk.data) {
            tracing::info!(sandbox = %self.id, "a secret's value in a file read out was masked");
        }
        let end = chunk.data.len().min(at.saturating_add(length as usize));
        chunk.data = chunk
            .data
            .get(at..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        Ok(Ok(chunk))
    }

    async fn read_raw(
        &mut self,
        path: &WorkspacePath,
        offset: u64,
        length: u64,
    ) -> Result<Result<FileChunk, String>, EngineError> {
        let path_bytes = path
            .raw
            .as_ref()
            .map(|raw| base64::engine::general_purpose::STANDARD.encode(raw));
        let request = |id| Request::Read {
            id,
            path: &path.text,
            path_bytes,
            offset,
            length,
        };
        let chunk = match self.control(request).await? {
            Reply::File(chunk) => chunk,
            _ => {
                return Err(self
                    .broken(ProtocolError::Malformed(
                        "an unexpected answer to a file read".into(),
                    ))
                    .await)
            }
        };
        if let Some(error) = chunk.error {
            return Ok(Err(truncate_chars(&error, 300)));
        }
        let data = base64::engine::general_purpose::STANDARD.decode(&chunk.data);
        match data {
            Ok(data) if data.len() as u64 <= length && chunk.inode.len() <= 64 => {
                super::stats::copied_out(data.len() as u64);
                Ok(Ok(FileChunk {
                    data,
                    size_hint: chunk.size,
                    inode: chunk.inode,
                }))
            }
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "a file piece that is not what was asked for".into(),
                ))
                .await),
        }
    }

    /// Writes `data` at `offset` of a workspace file, as the sandbox's user (offset 0 creates or
    /// truncates it, and its parent directories); never through a link, never over a directory.
    /// `Ok(Err(reason))`: the file cannot be written; `Err`: the sandbox failed.
    pub async fn write_chunk(
        &mut self,
        path: &str,
        data: &[u8],
        offset: u64,
    ) -> Result<Result<u64, String>, EngineError> {
        let data = base64::engine::general_purpose::STANDARD.encode(data);
        match self
            .control(|id| Request::Write {
                id,
                path,
                data,
                offset,
            })
            .await?
        {
            Reply::Written { error: Some(e), .. } => Ok(Err(truncate_chars(&e, 300))),
            Reply::Written { size, .. } => Ok(Ok(size)),
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a file write".into(),
                ))
                .await),
        }
    }

    /// Puts installed dependency directories first on the runner's `sys.path` (taking `remove`
    /// off); returns the directories that do not exist (and were not added).
    pub async fn add_paths(
        &mut self,
        add: &[String],
        remove: &[String],
    ) -> Result<Vec<String>, EngineError> {
        match self
            .control(|id| Request::Paths { id, add, remove })
            .await?
        {
            Reply::Paths { missing, .. } if missing.iter().all(|m| add.contains(m)) => {
                self.paths.retain(|p| !remove.contains(p));
                for path in add.iter().filter(|p| !missing.contains(p)) {
                    if !self.paths.contains(path) {
                        self.paths.push(path.clone());
                    }
                }
                Ok(missing)
            }
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a path update".into(),
                ))
                .await),
        }
    }

    /// Imports the top-level modules of `distributions` (in the sets on `sys.path`) into the
    /// runner, outside the code's namespace, within `limit`; returns the modules imported and
    /// those that failed. A prepared sandbox's work before it is handed out.
    pub async fn preload(
        &mut self,
        distributions: &[String],
        limit: Duration,
    ) -> Result<(Vec<String>, Vec<String>), EngineError> {
        match self
            .control_within(limit, |id| Request::Preload { id, distributions })
            .await?
        {
            Reply::Preloaded {
                imported, failed, ..
            } => Ok((imported, failed)),
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a preload".into(),
                ))
                .await),
        }
    }

    /// Saves the workspace and the namespace's variables into the runner's private snapshot
    /// file (`runner/snapshot.py`), stopping beyond `max_bytes`, within the call's `timeout`
    /// (it runs the values' own code: see [`Sandbox::work_within`]). The report is the sandbox's
    /// word: the caller bounds what it keeps of it.
    pub async fn snapshot(
        &mut self,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<RawSnapshotReport, EngineError> {
        match self
            .work_within(Work::Snapshot, timeout, |id| Request::Snapshot {
                id,
                max_bytes,
            })
            .await?
        {
            Reply::Snapshot(mut report) => {
                if let Some(redactor) = &self.redactor {
                    redactor.names(&mut report.saved);
                    redactor.names(&mut report.modules);
                    redactor.not_saved(&mut report.unsaved);
                    if let Some(error) = &mut report.error {
                        redactor.text(error);
                    }
                }
                Ok(report)
            }
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a snapshot".into(),
                ))
                .await),
        }
    }

    /// At most `length` bytes of the runner's snapshot file from `offset`. `Ok(Err(reason))`:
    /// the runner could not read it. With secrets, the piece is masked as the whole file would
    /// be (read with the bytes around it a value could reach into, like [`Sandbox::read_chunk`]):
    /// a value the code kept (an echoed key in a variable or a file) never reaches the store.
    pub async fn snapshot_chunk(
        &mut self,
        offset: u64,
        length: u64,
    ) -> Result<Result<Vec<u8>, String>, EngineError> {
        let Some(redactor) = self.redactor.clone() else {
            return self.snapshot_raw(offset, length).await;
        };
        let (start, wide, at) = redactor.widened(offset, length);
        let mut data: Vec<u8> = Vec::new();
        while (data.len() as u64) < wide {
            let want = (wide - data.len() as u64).min(READ_LIMIT);
            let piece = match self.snapshot_raw(start + data.len() as u64, want).await? {
                Ok(piece) => piece,
                Err(reason) => return Ok(Err(reason)),
            };
            let short = (piece.len() as u64) < want;
            data.extend_from_slice(&piece);
            if short {
                break;
            }
        }
        if redactor.bytes(&mut data) {
            tracing::info!(sandbox = %self.id, "a secret's value in a snapshot was masked");
        }
        let end = data.len().min(at.saturating_add(length as usize));
        Ok(Ok(data
            .get(at..end)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()))
    }

    async fn snapshot_raw(
        &mut self,
        offset: u64,
        length: u64,
    ) -> Result<Result<Vec<u8>, String>, EngineError> {
        match self
            .control(|id| Request::SnapshotRead { id, offset, length })
            .await?
        {
            Reply::Piece {
                error: Some(error), ..
            } => Ok(Err(truncate_chars(&error, 300))),
            Reply::Piece { data, .. } if data.len() as u64 <= length => Ok(Ok(data)),
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a snapshot read".into(),
                ))
                .await),
        }
    }

    /// Writes a piece of a snapshot to restore into the runner's private upload file (offset 0
    /// starts it anew); returns the file's size.
    pub async fn restore_chunk(
        &mut self,
        data: &[u8],
        offset: u64,
    ) -> Result<Result<u64, String>, EngineError> {
        match self
            .control_with(
                CONTROL_TIMEOUT,
                |id| Request::RestoreWrite { id, offset },
                data,
            )
            .await?
        {
            Reply::Written { error: Some(e), .. } => Ok(Err(truncate_chars(&e, 300))),
            Reply::Written { size, .. } => Ok(Ok(size)),
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a snapshot upload".into(),
                ))
                .await),
        }
    }

    /// Unpacks the uploaded snapshot into the workspace and the namespace, within the call's
    /// `timeout` (it runs the values' own code: see [`Sandbox::work_within`]).
    pub async fn restore(&mut self, timeout: Duration) -> Result<RawRestoreReport, EngineError> {
        match self
            .work_within(Work::Restore, timeout, |id| Request::Restore { id })
            .await?
        {
            Reply::Restored(mut report) => {
                if let Some(redactor) = &self.redactor {
                    redactor.names(&mut report.variables);
                    redactor.names(&mut report.modules);
                    redactor.not_saved(&mut report.failed);
                    if let Some(error) = &mut report.error {
                        redactor.text(error);
                    }
                }
                Ok(report)
            }
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a restore".into(),
                ))
                .await),
        }
    }

    /// Removes the runner's private snapshot and upload files.
    pub async fn discard_snapshot(&mut self) -> Result<(), EngineError> {
        match self.control(|id| Request::SnapshotDiscard { id }).await? {
            Reply::Discarded { .. } => Ok(()),
            _ => Err(self
                .broken(ProtocolError::Malformed(
                    "an unexpected answer to a snapshot discard".into(),
                ))
                .await),
        }
    }

    /// A short request that is not an execution: no capture, a fixed time limit.
    async fn control<'a>(
        &mut self,
        request: impl FnOnce(u64) -> Request<'a>,
    ) -> Result<Reply, EngineError> {
        self.control_within(CONTROL_TIMEOUT, request).await
    }

    /// A request that is not an execution, answered within `limit`.
    async fn control_within<'a>(
        &mut self,
        limit: Duration,
        request: impl FnOnce(u64) -> Request<'a>,
    ) -> Result<Reply, EngineError> {
        self.control_frames(limit, |id| request(id).to_frame())
            .await
    }

    /// A request followed by a frame of raw bytes, answered within `limit`.
    async fn control_with<'a>(
        &mut self,
        limit: Duration,
        request: impl FnOnce(u64) -> Request<'a>,
        payload: &[u8],
    ) -> Result<Reply, EngineError> {
        self.control_frames(limit, |id| request(id).to_frame_with(payload))
            .await
    }

    /// Sends the frames of a request that is not an execution, and waits `limit` for its reply.
    async fn control_frames(
        &mut self,
        limit: Duration,
        frames: impl FnOnce(u64) -> Vec<u8>,
    ) -> Result<Reply, EngineError> {
        let (mut runner, _) = self.take_runner("a request was abandoned").await?;
        self.next_request += 1;
        let id = self.next_request;
        runner.decoder.set_limit(4 << 20);
        let reply = match runner.send(&frames(id)).await {
            Err(failure) => Err(failure),
            Ok(()) => match tokio::time::timeout(limit, runner.next_reply()).await {
                Ok(reply) => reply,
                Err(_) => Err(RunnerFailure::Backend(BackendError::Unexpected(
                    "the sandbox did not answer in time".into(),
                ))),
            },
        };
        self.control_answered(runner, id, reply).await
    }

    /// A request that runs the session's own code though it is not an execution (a snapshot's
    /// pickling runs its values' `__reduce__`, a restore's unpickling theirs): bounded by the
    /// call's `timeout` as an execution is. When it is up the code is interrupted
    /// (KeyboardInterrupt, `interruptible` in python/runner/execute.py) and given
    /// its grace ([`interrupt::grace`]); code that does not stop has its processes killed, as an execution's
    /// has. Then [`EngineError::WorkTimedOut`] says what the session lost.
    async fn work_within<'a>(
        &mut self,
        work: Work,
        timeout: Duration,
        request: impl FnOnce(u64) -> Request<'a>,
    ) -> Result<Reply, EngineError> {
        let (mut runner, _) = self.take_runner("a request was abandoned").await?;
        self.next_request += 1;
        let id = self.next_request;
        runner.decoder.set_limit(4 << 20);
        let reply = match runner.send(&request(id).to_frame()).await {
            Err(failure) => Err(failure),
            Ok(()) => match tokio::time::timeout(timeout, runner.next_reply()).await {
                Ok(reply) => reply,
                Err(_) => {
                    let lost = self.stop_work(runner, id).await?;
                    return Err(EngineError::WorkTimedOut {
                        work,
                        timeout,
                        lost,
                    });
                }
            },
        };
        self.control_answered(runner, id, reply).await
    }

    /// Interrupts work past its timeout, then kills its processes if it does not answer within
    /// the grace (as [`Sandbox::await_result`] and [`Sandbox::kill_processes`] do for an
    /// execution); returns what the session lost.
    async fn stop_work(&mut self, mut runner: Runner, id: u64) -> Result<WorkLost, EngineError> {
        tracing::info!(sandbox = %self.id, "a snapshot or restore ran past the timeout: interrupting");
        let reply = self.interrupt().await.within(runner.next_reply()).await;
        match reply {
            Some(Ok(reply)) if reply.id() == Some(id) => {
                // The runner answered (with the interruption, or the work it just finished):
                // either way nothing of it is used.
                self.state = State::Ready(runner);
                Ok(WorkLost::Nothing)
            }
            Some(Err(RunnerFailure::Exited(_))) => {
                self.state = State::Respawning(runner);
                Ok(WorkLost::Variables)
            }
            _ => {
                tracing::info!(sandbox = %self.id, "no answer to the interrupt: killing its processes");
                Ok(if self.kill_processes(runner).await? {
                    WorkLost::Variables
                } else {
                    WorkLost::Everything
                })
            }
        }
    }

    /// The sandbox's state after the reply (or the failure) to control request `id`.
    async fn control_answered(
        &mut self,
        runner: Runner,
        id: u64,
        reply: Result<Reply, RunnerFailure>,
    ) -> Result<Reply, EngineError> {
        match reply {
            Ok(reply) if reply.id() == Some(id) => {
                self.state = State::Ready(runner);
                Ok(reply)
            }
            Ok(_) => Err(self
                .broken(ProtocolError::Malformed(
                    "an answer to another request".into(),
                ))
                .await),
            Err(RunnerFailure::Protocol(e)) => Err(self.broken(e).await),
            Err(RunnerFailure::Exited(exit)) => {
                self.state = State::Respawning(runner);
                Err(EngineError::SandboxStart(format!(
                    "the sandbox's runner exited (status {}); try again",
                    exit.exit_code()
                )))
            }
            Err(RunnerFailure::Ended) => {
                let reason = Self::why_stopped(&self.backend, &self.id).await?;
                self.state = State::Down(reason.clone());
                Err(EngineError::SandboxLost(reason))
            }
            Err(RunnerFailure::Backend(e)) => {
                self.state = State::Down(e.to_string());
                let _ = self.backend.kill(&self.id).await;
                Err(e.into())
            }
        }
    }

    /// The runner died mid-execution: the code killed it (os._exit, a signal) or the kernel did
    /// (out of memory). The result says which. When the supervisor reported it, a new runner is
    /// on its way (files kept); when the whole sandbox ended, it restarts on next use.
    async fn runner_died(
        &mut self,
        runner: Runner,
        failure: RunnerFailure,
        elapsed: Duration,
        memory_killed: bool,
    ) -> Result<Execution, EngineError> {
        match failure {
            RunnerFailure::Protocol(e) => Err(self.broken(e).await),
            RunnerFailure::Backend(e) => {
                // The attached stream broke (the engine went away, or the connection did): the
                // runner cannot be reached again, so the sandbox is lost.
                self.state = State::Down(e.to_string());
                let reason = Self::why_stopped(&self.backend, &self.id).await?;
                Err(EngineError::SandboxLost(format!("{reason} ({e})")))
            }
            RunnerFailure::Exited(exit) => {
                self.state = State::Respawning(runner);
                let code = exit.exit_code();
                let out_of_memory = exit.out_of_memory() || memory_killed;
                let (stderr, error) = if out_of_memory {
                    (
                        "MemoryError: the sandbox ran out of memory and its Python process was \
                         killed; variables from earlier executions are lost, files in /workspace \
                         remain.\n"
                            .to_string(),
                        Some(RaisedException {
                            kind: "MemoryError".into(),
                            message: "out of memory".into(),
                        }),
                    )
                } else {
                    let how = if exit.status < 0 {
                        format!("was killed by signal {}", -exit.status)
                    } else {
                        format!("exited with status {}", exit.status)
                    };
                    (
                        format!(
                            "The sandbox's Python process {how} during the execution; variables \
                             from earlier executions are lost, files in /workspace remain.\n"
                        ),
                        None,
                    )
                };
                Ok(Execution {
                    stderr: stderr.into_bytes(),
                    exit_code: code,
                    duration: elapsed,
                    state_lost: true,
                    out_of_memory,
                    error,
                    ..Default::default()
                })
            }
            RunnerFailure::Ended => {
                let reason = Self::why_stopped(&self.backend, &self.id).await?;
                let reason = with_diagnostics(reason, &runner.diagnostics);
                self.state = State::Down(reason.clone());
                Err(EngineError::SandboxLost(reason))
            }
        }
    }

    /// Why the whole sandbox stopped (its supervisor included): never the code's doing, since the
    /// supervisor ignores every signal the code may send it. An unreachable engine is an error.
    async fn why_stopped(
        backend: &Arc<dyn Backend>,
        id: &SandboxId,
    ) -> Result<String, EngineError> {
        Ok(match backend.exit_info(id).await {
            Ok(info) if info.oom_killed => "it ran out of memory and the kernel stopped it".into(),
            Ok(info) if info.running => "its connection to the server broke".into(),
            Ok(info) => match info.exit_code {
                Some(137) => "its container was killed from outside the server (exit status 137, \
                              SIGKILL: `docker kill`, `docker rm -f`, `docker stop` or an engine \
                              restart)"
                    .into(),
                Some(143) => "its container was stopped from outside the server (exit status 143, \
                              SIGTERM: `docker stop` or an engine restart)"
                    .into(),
                Some(code) => format!(
                    "its container was stopped from outside the server (exit status {code})"
                ),
                None => "its container was stopped from outside the server".into(),
            },
            Err(BackendError::NotFound(_)) => {
                "its container was removed from outside the server".into()
            }
            Err(e) => return Err(e.into()),
        })
    }

    /// The runner broke the protocol (the code can do that): stop it and report.
    async fn broken(&mut self, e: ProtocolError) -> EngineError {
        tracing::warn!(sandbox = %self.id, "runner protocol broken: {e}");
        self.state = State::Down(e.to_string());
        if let Err(kill) = self.backend.kill(&self.id).await {
            tracing::warn!(sandbox = %self.id, "kill failed: {kill}");
        }
        EngineError::Protocol(e)
    }

    /// Marks the sandbox removed by someone else (no removal is attempted again on drop).
    pub(crate) fn forget(&mut self) {
        self.state = State::Destroyed;
    }

    /// Removes the sandbox and its storage.
    /// Makes a sandbox a call has used as good as a new one, for another call of the same
    /// caller: its supervisor kills every other process, empties every place the code could
    /// write and starts a new runner from the state it prepared before any code ran
    /// ([`Backend::recycle`]). Succeeds only when the supervisor reported nothing left, a new
    /// runner said it is ready, and a round trip under an id the code could not guess came back
    /// (frames the code may have written ahead of the supervisor's come first, and fail it). On
    /// any error the sandbox is not to serve again: remove it.
    pub(crate) async fn recycle(&mut self) -> Result<(), EngineError> {
        let State::Ready(mut runner) =
            std::mem::replace(&mut self.state, State::Down("being recycled".into()))
        else {
            return Err(EngineError::SandboxStart("not ready to be recycled".into()));
        };
        if !self.paths.is_empty() || self.egress.is_some() {
            return Err(EngineError::SandboxStart(
                "a sandbox with dependencies or a network is never recycled".into(),
            ));
        }
        let started = std::time::Instant::now();
        self.backend.recycle(&self.id).await?;
        let signalled = started.elapsed();
        let reported = async {
            loop {
                match runner.next_reply().await {
                    Err(RunnerFailure::Exited(exit)) => return Ok(exit),
                    Ok(_) => continue, // a reply, or what the code wrote, before the recycle
                    Err(e) => return Err(e),
                }
            }
        };
        let exit = match tokio::time::timeout(RECYCLE_LIMIT, reported).await {
            Ok(Ok(exit)) => exit,
            Ok(Err(failure)) => {
                let why = match failure {
                    RunnerFailure::Exited(_) => "the runner exited".to_string(),
                    RunnerFailure::Ended => "the sandbox ended".to_string(),
                    RunnerFailure::Protocol(e) => e.to_string(),
                    RunnerFailure::Backend(e) => e.to_string(),
                };
                return Err(EngineError::SandboxStart(format!(
                    "the recycle failed: {why}"
                )));
            }
            Err(_) => {
                return Err(EngineError::SandboxStart(
                    "the supervisor did not report the recycle in time".into(),
                ))
            }
        };
        if !exit.requested || exit.recycled != Some(0) {
            return Err(EngineError::SandboxStart(format!(
                "the sandbox could not be emptied (the supervisor said {:?})",
                exit.recycled
            )));
        }
        let emptied = started.elapsed();
        self.respawned(runner).await?;
        let ready = started.elapsed();
        // Request ids the code saw are sequential: this one it cannot have guessed.
        self.next_request = u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        ) >> 1;
        self.add_paths(&[], &[]).await?;
        self.recycles += 1;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            sandbox = %self.id,
            signal_ms = ms(signalled),
            emptied_ms = ms(emptied),
            ready_ms = ms(ready),
            total_ms = ms(started.elapsed()),
            "recycle phases"
        );
        Ok(())
    }

    pub async fn destroy(mut self) {
        self.destroy_in_place().await;
    }

    pub(crate) async fn destroy_in_place(&mut self) {
        if matches!(self.state, State::Destroyed) {
            return;
        }
        self.state = State::Destroyed;
        if let Err(e) = self.backend.destroy(&self.id).await {
            tracing::warn!(sandbox = %self.id, "could not remove the sandbox: {e}");
        }
        // Its egress network goes once it is gone.
        if let Some(lease) = self.egress.take() {
            lease.release().await;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if matches!(self.state, State::Destroyed) {
            return;
        }
        // Dropped mid-flight (a cancelled request): remove it in the background.
        let backend = self.backend.clone();
        let id = self.id.clone();
        let lease = self.egress.take();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = backend.destroy(&id).await {
                    tracing::warn!(sandbox = %id, "could not remove an abandoned sandbox: {e}");
                }
                if let Some(lease) = lease {
                    lease.release().await;
                }
            });
        }
    }
}

/// A reason followed by what the sandbox printed outside the protocol, if anything.
fn with_diagnostics(mut reason: String, diagnostics: &[u8]) -> String {
    let text = String::from_utf8_lossy(diagnostics);
    let text = text.trim();
    if !text.is_empty() {
        reason.push_str(": ");
        reason.push_str(text);
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::RawLiveOutput;

    /// A secret's value the code prints in two pieces (two live messages) never reaches the
    /// client whole: the start is held back until the rest comes, then masked; what is held at
    /// the end is passed then.
    #[test]
    fn live_output_masks_a_value_split_across_messages() {
        use crate::config::secrets::{BoundHost, Secret, SecretValue, Secrets};
        use base64::Engine as _;
        let key = "sk-live-0123456789abcdefghij";
        let secrets = Secrets {
            entries: vec![Secret {
                name: "llm".into(),
                value: SecretValue::new(key.into()),
                hosts: vec![BoundHost {
                    pattern: "api.test".into(),
                    port: 443,
                }],
                header: "Authorization".into(),
                format: "{value}".into(),
                env: "KEY".into(),
            }],
            file: None,
        };
        let redactor = super::super::redact::Redactor::of(&secrets).expect("a value");
        let seen = Arc::new(std::sync::Mutex::new(String::new()));
        let into = seen.clone();
        let mut target = LiveTarget {
            id: 1,
            sink: Arc::new(move |output: LiveOutput| {
                if let Ok(mut seen) = into.lock() {
                    seen.push_str(&output.stdout);
                }
            }),
            tokens: LIVE_BURST,
            refilled: Instant::now(),
            held: None,
            redact: Some([redactor.stream(), redactor.stream()]),
        };
        let message = |text: &str| RawLiveOutput {
            id: 1,
            cleared: false,
            stdout: base64::engine::general_purpose::STANDARD.encode(text),
            stderr: String::new(),
            stdout_skipped: 0,
            stderr_skipped: 0,
            order: Vec::new(),
        };
        target.pass(&message(&format!("key: {}", &key[..9])));
        target.pass(&message(&format!("{} done sk-", &key[9..])));
        target.finish();
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert!(!seen.contains(key), "{seen}");
        assert_eq!(seen, "key: <redacted:llm>************** done sk-");
    }

    #[test]
    fn live_output_passes_only_for_its_execution_and_within_the_rate() {
        let passed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = passed.clone();
        let mut target = LiveTarget {
            id: 7,
            sink: Arc::new(move |_| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }),
            tokens: LIVE_BURST,
            refilled: Instant::now(),
            held: None,
            redact: None,
        };
        let output = |id| RawLiveOutput {
            id,
            cleared: false,
            stdout: "aGkK".into(),
            stderr: String::new(),
            stdout_skipped: 0,
            stderr_skipped: 0,
            order: Vec::new(),
        };
        target.pass(&output(8));
        assert_eq!(passed.load(std::sync::atomic::Ordering::Relaxed), 0);
        // A flood: the burst passes, the rest waits for the rate (far more than these calls take).
        for _ in 0..100 {
            target.pass(&output(7));
        }
        assert_eq!(
            passed.load(std::sync::atomic::Ordering::Relaxed),
            LIVE_BURST as usize
        );
    }

    #[test]
    fn what_the_rate_held_back_reaches_the_next_message_or_the_end() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let target = |tokens| {
            let seen = seen.clone();
            LiveTarget {
                id: 1,
                sink: Arc::new(move |output: LiveOutput| {
                    if let Ok(mut seen) = seen.lock() {
                        seen.push((output.cleared, output.stdout));
                    }
                }),
                tokens,
                refilled: Instant::now(),
                redact: None,
                held: None,
            }
        };
        let output = |cleared, b64: &str| RawLiveOutput {
            id: 1,
            cleared,
            stdout: b64.into(),
            stderr: String::new(),
            stdout_skipped: 0,
            stderr_skipped: 0,
            order: Vec::new(),
        };
        // "YQo=" is "a\n", "Ygo=" is "b\n", "Ywo=" is "c\n". One token: the clear and the
        // text after it are held back, then passed with the next message.
        let mut one = target(1.0);
        one.pass(&output(false, "YQo="));
        one.pass(&output(true, "Ygo="));
        one.tokens = 1.0;
        one.pass(&output(false, "Ywo="));
        one.finish();
        // No token at all: what was held back comes at the end, once.
        let mut none = target(0.0);
        none.pass(&output(true, "Ygo="));
        none.pass(&output(false, "Ywo="));
        none.finish();
        assert_eq!(
            *seen.lock().expect("seen"),
            [
                (false, "a\n".to_string()),
                (true, "b\nc\n".to_string()),
                (true, "b\nc\n".to_string())
            ]
        );
    }
}
