//! [`FakeBackend`]: a [`Backend`] without containers, for tests only. It gives NO isolation: the
//! real runner (`python/runner/`, through the real bootstrap and loader) runs as an ordinary child process of the
//! test, as the test's own user, with a temporary directory as its workspace. It is compiled only
//! for `cargo test` (`#[cfg(test)]`), so no configuration can ever select it.
//!
//! What a container's pid 1 supervisor does (`supervise` in python/runner/supervisor.py), a task here does: it
//! starts the runner, relays the host's frames to it and its frames back, reports each death
//! with an `exited` frame and starts a new runner, which keeps the workspace. The runner itself
//! is told it runs on the host with `--host-test-workspace=DIR` after the bootstrap: DIR is its
//! workspace, and it never sweeps processes with `kill(-1)`, which on a host would reach the
//! host's own. Each runner leads a process group of its own, so killing "every process of the
//! sandbox" kills that group.
//!
//! Faults a test can inject: a runner killed (optionally "by the kernel for memory"), the whole
//! sandbox stopped from outside with any exit status (137 for `docker kill`) or out of memory,
//! the sandbox removed from outside, garbage on the protocol stream, slow or failing starts, and
//! `NotFound` from `destroy`. Every call the engine makes is logged as an [`Event`].

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::engine::backend::{
    Backend, BackendError, BackendInfo, EngineKind, ExitInfo, OutputChunk, RunnerStreams,
    SandboxId, SandboxRecord, SandboxSpec,
};

/// The argument that puts the runner in its host test mode (see python/runner/host_test.py).
const HOST_TEST_FLAG: &str = "--host-test-workspace=";

/// What the engine asked of the backend, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Created(SandboxId),
    Started(SandboxId),
    Interrupted(SandboxId),
    KilledProcesses(SandboxId),
    Killed(SandboxId),
    Destroyed(SandboxId),
}

/// Faults that apply to the next calls, whichever sandbox they concern.
#[derive(Debug, Default)]
struct Faults {
    start_delay: Duration,
    failing_starts: usize,
    destroy_not_found: bool,
}

/// A sandbox as the fake knows it.
struct FakeSandbox {
    labels: BTreeMap<String, String>,
    /// The runner's argv (`None`: a record made by [`FakeBackend::add_foreign`], never started).
    command: Option<Vec<String>>,
    workspace: PathBuf,
    /// The supervisor of the current start, while it runs.
    supervisor: Option<SupervisorHandle>,
    /// Counts starts, so a supervisor that ends late cannot overwrite a newer start's state.
    generation: u64,
    exit: ExitInfo,
}

struct SupervisorHandle {
    control: mpsc::UnboundedSender<Control>,
}

/// What the backend asks of a sandbox's supervisor task.
enum Control {
    /// SIGINT to the runner (the real supervisor passes the host's SIGINT on).
    Interrupt,
    /// Kill the runner's processes on the host's request: the `exited` frame says `requested`.
    KillProcesses,
    /// Kill the runner as the kernel would (`oom`: for memory); it is restarted.
    KillRunner { oom: bool },
    /// Raw bytes on the protocol stream, as if the runner had written them.
    Inject(Bytes),
    /// End the whole sandbox, supervisor included, with this exit information.
    Stop {
        exit_code: i64,
        oom_killed: bool,
        done: oneshot::Sender<()>,
    },
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<SandboxId, FakeSandbox>,
    /// Volumes (or networks) with their labels, for `remove_orphaned_storage`.
    storage: BTreeMap<String, BTreeMap<String, String>>,
    events: Vec<Event>,
    faults: Faults,
    next_id: u64,
}

struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Test code: a panic while holding the lock leaves plain data, still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A test-only backend that runs the real runner as a host process, without any isolation.
pub struct FakeBackend {
    shared: Arc<Shared>,
    /// Holds one directory per sandbox (its workspace); removed when the backend is dropped.
    root: PathBuf,
}

impl FakeBackend {
    pub fn new() -> FakeBackend {
        let root = std::env::temp_dir().join(format!(
            "pcs-fake-backend-{}",
            uuid::Uuid::new_v4().simple()
        ));
        FakeBackend {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
            }),
            root,
        }
    }

    /// Every call the engine made so far.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().events.clone()
    }

    /// How many logged events `matches` accepts.
    pub fn count(&self, matches: impl Fn(&Event) -> bool) -> usize {
        self.shared
            .lock()
            .events
            .iter()
            .filter(|e| matches(e))
            .count()
    }

    /// The sandboxes that exist (created and not destroyed), in creation order.
    pub fn sandboxes(&self) -> Vec<SandboxId> {
        let mut ids: Vec<SandboxId> = self.shared.lock().sandboxes.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Sandboxes whose supervisor runs now.
    pub fn running(&self) -> usize {
        self.shared
            .lock()
            .sandboxes
            .values()
            .filter(|s| s.supervisor.is_some())
            .count()
    }

    /// The host directory that is `id`'s workspace.
    pub fn workspace(&self, id: &SandboxId) -> Option<PathBuf> {
        self.shared
            .lock()
            .sandboxes
            .get(id)
            .map(|s| s.workspace.clone())
    }

    /// The next `start` calls wait this long first.
    pub fn set_start_delay(&self, delay: Duration) {
        self.shared.lock().faults.start_delay = delay;
    }

    /// The next `count` starts fail.
    pub fn fail_next_starts(&self, count: usize) {
        self.shared.lock().faults.failing_starts = count;
    }

    /// `destroy` removes the sandbox but answers `NotFound`, as when someone removed it first.
    pub fn destroy_reports_not_found(&self, on: bool) {
        self.shared.lock().faults.destroy_not_found = on;
    }

    /// Kills the runner (not the sandbox): the supervisor reports the death and starts a new one.
    /// `oom`: the report says the kernel killed it for memory.
    pub fn kill_runner(&self, id: &SandboxId, oom: bool) {
        self.send(id, Control::KillRunner { oom });
    }

    /// Puts raw bytes on the protocol stream, as if the runner had written them.
    pub fn inject_output(&self, id: &SandboxId, bytes: &[u8]) {
        self.send(id, Control::Inject(Bytes::copy_from_slice(bytes)));
    }

    /// Stops the whole sandbox from outside the server (`docker kill`: 137, `docker stop`: 143;
    /// `oom_killed`: the kernel did, for memory). It stays, stopped, until destroyed or started.
    pub async fn stop_from_outside(&self, id: &SandboxId, exit_code: i64, oom_killed: bool) {
        self.stop(id, exit_code, oom_killed).await;
    }

    /// Stops and removes a sandbox behind the server's back (`docker rm -f`).
    pub async fn remove_from_outside(&self, id: &SandboxId) {
        self.stop(id, 137, false).await;
        if let Some(sandbox) = self.shared.lock().sandboxes.remove(id) {
            let _ = std::fs::remove_dir_all(&sandbox.workspace);
        }
    }

    /// A sandbox this backend did not start (another server's, or one whose create completed
    /// after its request was dropped): listed and removable, never running.
    pub fn add_foreign(&self, labels: BTreeMap<String, String>) -> SandboxId {
        let mut state = self.shared.lock();
        state.next_id += 1;
        // Sortable by creation, and as long and random as an engine's ids (sessions are found by
        // a unique prefix of 12 characters or more).
        let id = SandboxId(format!(
            "{:04}{}",
            state.next_id,
            uuid::Uuid::new_v4().simple()
        ));
        let workspace = self.root.join(&id.0);
        state.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                labels,
                command: None,
                workspace,
                supervisor: None,
                generation: 0,
                exit: ExitInfo::default(),
            },
        );
        id
    }

    /// A storage volume no sandbox uses, with these labels.
    pub fn add_storage(&self, name: &str, labels: BTreeMap<String, String>) {
        self.shared.lock().storage.insert(name.to_string(), labels);
    }

    /// The storage volumes that exist.
    pub fn storage(&self) -> Vec<String> {
        self.shared.lock().storage.keys().cloned().collect()
    }

    fn send(&self, id: &SandboxId, control: Control) {
        if let Some(supervisor) = self
            .shared
            .lock()
            .sandboxes
            .get(id)
            .and_then(|s| s.supervisor.as_ref())
        {
            let _ = supervisor.control.send(control);
        }
    }

    /// Ends the sandbox's supervisor and waits until its state says so.
    async fn stop(&self, id: &SandboxId, exit_code: i64, oom_killed: bool) {
        let (done, stopped) = oneshot::channel();
        self.send(
            id,
            Control::Stop {
                exit_code,
                oom_killed,
                done,
            },
        );
        let _ = tokio::time::timeout(Duration::from_secs(10), stopped).await;
    }

    fn log(&self, event: Event) {
        self.shared.lock().events.push(event);
    }
}

impl Default for FakeBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        for sandbox in state.sandboxes.values_mut() {
            // Dropping the control channel ends the supervisor, which kills its runner.
            sandbox.supervisor = None;
        }
        drop(state);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn not_found(id: &SandboxId) -> BackendError {
    BackendError::NotFound(id.clone())
}

#[async_trait]
impl Backend for FakeBackend {
    async fn info(&self) -> Result<BackendInfo, BackendError> {
        Ok(BackendInfo {
            name: "fake (tests only, no isolation)".into(),
            kind: EngineKind::Fake,
            version: "0".into(),
            api_version: "0".into(),
            rootless: false,
            userns_remap: false,
            cgroup_version: None,
            runtimes: BTreeMap::new(),
            runtime_paths: BTreeMap::new(),
            default_runtime: None,
            unenforced: Vec::new(),
            endpoint: "fake".into(),
            remote: false,
            memory_bytes: None,
            cpus: None,
        })
    }

    async fn ensure_image(&self, _image: &str) -> Result<(), BackendError> {
        Ok(())
    }

    async fn image_id(&self, image: &str) -> Result<String, BackendError> {
        Ok(format!("fake:{image}"))
    }

    async fn image_labels(
        &self,
        _image: &str,
    ) -> Result<std::collections::HashMap<String, String>, BackendError> {
        Ok(Default::default())
    }

    /// The runner's IPython is the test process's `PCS_TEST_IPYTHON` (see [`spawn_runner`]).
    fn gives_runner_ipython(&self) -> bool {
        true
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxId, BackendError> {
        let id = self.add_foreign(spec.labels.clone());
        let workspace = {
            let mut state = self.shared.lock();
            let sandbox = state.sandboxes.get_mut(&id).ok_or_else(|| not_found(&id))?;
            sandbox.command = Some(spec.command.clone());
            sandbox.workspace.clone()
        };
        std::fs::create_dir_all(&workspace).map_err(|e| {
            BackendError::Unexpected(format!("workspace {}: {e}", workspace.display()))
        })?;
        self.log(Event::Created(id.clone()));
        Ok(id)
    }

    async fn start(&self, id: &SandboxId) -> Result<RunnerStreams, BackendError> {
        let delay = self.shared.lock().faults.start_delay;
        tokio::time::sleep(delay).await;
        let (host_input, runner_input) = tokio::io::duplex(1 << 16);
        let (output, output_receiver) = mpsc::channel(64);
        let (control, control_receiver) = mpsc::unbounded_channel();
        let (command, workspace, generation) = {
            let mut state = self.shared.lock();
            if state.faults.failing_starts > 0 {
                state.faults.failing_starts -= 1;
                return Err(BackendError::Unexpected(
                    "a start failed (injected fault)".into(),
                ));
            }
            let sandbox = state.sandboxes.get_mut(id).ok_or_else(|| not_found(id))?;
            let Some(command) = sandbox.command.clone() else {
                return Err(BackendError::Unexpected(format!(
                    "{id} was not created by this backend"
                )));
            };
            if sandbox.supervisor.is_some() {
                return Err(BackendError::Unexpected(format!("{id} is already running")));
            }
            sandbox.generation += 1;
            sandbox.supervisor = Some(SupervisorHandle { control });
            sandbox.exit = ExitInfo {
                running: true,
                exit_code: None,
                oom_killed: false,
                started_at: Some(format!("start {}", sandbox.generation)),
            };
            (command, sandbox.workspace.clone(), sandbox.generation)
        };
        // A start after a stop has a fresh workspace, as a container's tmpfs does.
        let _ = std::fs::remove_dir_all(&workspace);
        std::fs::create_dir_all(&workspace).map_err(|e| {
            BackendError::Unexpected(format!("workspace {}: {e}", workspace.display()))
        })?;
        let mut argv = command;
        argv.push(format!("{HOST_TEST_FLAG}{}", workspace.display()));
        let supervisor = Supervisor {
            shared: self.shared.clone(),
            id: id.clone(),
            generation,
            argv,
            workspace,
            output,
        };
        tokio::spawn(supervisor.run(runner_input, control_receiver));
        self.log(Event::Started(id.clone()));
        let output = futures_util::stream::unfold(output_receiver, |mut receiver| async move {
            receiver.recv().await.map(|chunk| (chunk, receiver))
        });
        Ok(RunnerStreams {
            input: Box::pin(host_input),
            output: Box::pin(output),
        })
    }

    async fn interrupt(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.log(Event::Interrupted(id.clone()));
        self.send(id, Control::Interrupt);
        Ok(())
    }

    async fn kill_processes(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.log(Event::KilledProcesses(id.clone()));
        self.send(id, Control::KillProcesses);
        Ok(())
    }

    async fn kill(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.log(Event::Killed(id.clone()));
        if !self.shared.lock().sandboxes.contains_key(id) {
            return Err(not_found(id));
        }
        self.stop(id, 137, false).await;
        Ok(())
    }

    async fn exit_info(&self, id: &SandboxId) -> Result<ExitInfo, BackendError> {
        self.shared
            .lock()
            .sandboxes
            .get(id)
            .map(|s| s.exit.clone())
            .ok_or_else(|| not_found(id))
    }

    async fn copy_in(&self, _: &SandboxId, _: &str, _: Bytes) -> Result<(), BackendError> {
        Err(BackendError::Unexpected(
            "copy_in is not supported by the fake backend".into(),
        ))
    }

    async fn copy_out(&self, _: &SandboxId, _: &str, _: u64) -> Result<Bytes, BackendError> {
        Err(BackendError::Unexpected(
            "copy_out is not supported by the fake backend".into(),
        ))
    }

    async fn destroy(&self, id: &SandboxId) -> Result<(), BackendError> {
        self.stop(id, 137, false).await;
        let (removed, not_found_fault) = {
            let mut state = self.shared.lock();
            (state.sandboxes.remove(id), state.faults.destroy_not_found)
        };
        let Some(sandbox) = removed else {
            return Ok(()); // gone already: success, as the trait says
        };
        let _ = std::fs::remove_dir_all(&sandbox.workspace);
        self.log(Event::Destroyed(id.clone()));
        if not_found_fault {
            return Err(not_found(id));
        }
        Ok(())
    }

    async fn list(&self, label: &str, value: &str) -> Result<Vec<SandboxRecord>, BackendError> {
        let mut records: Vec<SandboxRecord> = self
            .shared
            .lock()
            .sandboxes
            .iter()
            .filter(|(_, s)| s.labels.get(label).map(String::as_str) == Some(value))
            .map(|(id, s)| SandboxRecord {
                id: id.clone(),
                labels: s.labels.clone(),
            })
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }

    async fn create_network(
        &self,
        name: &str,
        _internal: bool,
        _subnet: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), BackendError> {
        self.add_storage(name, labels.clone());
        Ok(())
    }

    async fn remove_network(&self, name: &str) -> Result<(), BackendError> {
        self.shared.lock().storage.remove(name);
        Ok(())
    }

    async fn connect_network(&self, id: &SandboxId, _network: &str) -> Result<(), BackendError> {
        self.exit_info(id).await.map(|_| ())
    }

    async fn disconnect_network(
        &self,
        _id: &SandboxId,
        _network: &str,
    ) -> Result<(), BackendError> {
        Ok(())
    }

    async fn address_on(&self, id: &SandboxId, _network: &str) -> Result<String, BackendError> {
        self.exit_info(id).await.map(|_| "127.0.0.1".into())
    }

    async fn remove_volume(&self, name: &str) -> Result<(), BackendError> {
        self.shared.lock().storage.remove(name);
        Ok(())
    }

    async fn remove_orphaned_storage(
        &self,
        label: &str,
        value: &str,
        orphaned: &(dyn for<'l> Fn(&'l BTreeMap<String, String>) -> bool + Sync),
    ) -> Result<usize, BackendError> {
        let mut state = self.shared.lock();
        let before = state.storage.len();
        state.storage.retain(|_, labels| {
            !(labels.get(label).map(String::as_str) == Some(value) && orphaned(labels))
        });
        Ok(before - state.storage.len())
    }
}

/// Plays the container's pid 1 for one start of a sandbox.
struct Supervisor {
    shared: Arc<Shared>,
    id: SandboxId,
    generation: u64,
    argv: Vec<String>,
    workspace: PathBuf,
    output: mpsc::Sender<Result<OutputChunk, BackendError>>,
}

/// How the sandbox ended: its exit status, and whether the kernel stopped it for memory.
struct Ending {
    exit_code: i64,
    oom_killed: bool,
    done: Option<oneshot::Sender<()>>,
}

/// The runner's process group, killed when this is dropped (however the supervisor ends).
struct ProcessGroup(i32);

impl ProcessGroup {
    /// Signals the runner alone (it leads the group).
    fn signal_leader(&self, signal: i32) {
        // SAFETY: kill(2) takes plain integers; the pid is the runner's, still unreaped (the
        // supervisor reaps it only after this loop), so it cannot name another process.
        unsafe {
            libc::kill(self.0, signal);
        }
    }

    /// Signals every process of the group.
    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) takes plain integers; a negative pid names the runner's own group
        // (the runner was started as its leader), never another process's.
        unsafe {
            libc::kill(-self.0, signal);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

impl Supervisor {
    async fn run(self, from_host: DuplexStream, mut control: mpsc::UnboundedReceiver<Control>) {
        let ending = self.serve(from_host, &mut control).await;
        self.finish(ending);
    }

    /// Starts runners until the sandbox ends; returns how it ended.
    async fn serve(
        &self,
        mut from_host: DuplexStream,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Ending {
        // The bootstrap's first two frames start the runner (its loader, then its modules):
        // every new runner gets them again, as a forked runner inherits them in a sandbox.
        let mut source = Vec::new();
        for _ in 0..2 {
            let frame = tokio::select! {
                frame = read_frame(&mut from_host) => match frame {
                    Some(frame) => frame,
                    None => return Ending::quiet(0),
                },
                stop = next_stop(control) => return stop,
            };
            source.extend_from_slice(&frame);
        }
        // The host's frames go to whichever runner is alive (the slot is empty between runners).
        let stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>> = Default::default();
        let hung_up = CancellationToken::new();
        let _relay = AbortOnDrop(tokio::spawn(relay(
            from_host,
            stdin.clone(),
            hung_up.clone(),
        )));
        loop {
            let started = Instant::now();
            let mut child = match spawn_runner(&self.argv, &self.workspace) {
                Ok(child) => child,
                Err(e) => {
                    let message = format!("the fake backend could not start the runner: {e}");
                    let _ = self
                        .output
                        .send(Ok(OutputChunk::Stderr(message.into())))
                        .await;
                    return Ending::quiet(127);
                }
            };
            let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
                return Ending::quiet(127);
            };
            let group = ProcessGroup(pid);
            let mut pipe = child.stdin.take();
            if let Some(pipe) = pipe.as_mut() {
                // A runner that dies at once is reported below like any other death.
                let _ = pipe.write_all(&source).await;
                let _ = pipe.flush().await;
            }
            *stdin.lock().await = pipe;
            let readers = [
                forward(
                    child.stdout.take(),
                    OutputChunk::Stdout,
                    self.output.clone(),
                ),
                forward(
                    child.stderr.take(),
                    OutputChunk::Stderr,
                    self.output.clone(),
                ),
            ];
            let mut requested = false;
            let mut oom = false;
            let outcome = loop {
                tokio::select! {
                    status = child.wait() => break Ok(status),
                    () = hung_up.cancelled() => break Err(Ending::quiet(0)),
                    message = control.recv() => match message {
                        Some(Control::Interrupt) => group.signal_leader(libc::SIGINT),
                        Some(Control::KillProcesses) => {
                            requested = true;
                            group.signal(libc::SIGKILL);
                        }
                        Some(Control::KillRunner { oom: for_memory }) => {
                            oom = for_memory;
                            group.signal(libc::SIGKILL);
                        }
                        Some(Control::Inject(bytes)) => {
                            let _ = self.output.send(Ok(OutputChunk::Stdout(bytes))).await;
                        }
                        Some(Control::Stop { exit_code, oom_killed, done }) => {
                            break Err(Ending { exit_code, oom_killed, done: Some(done) });
                        }
                        None => break Err(Ending::quiet(0)),
                    },
                }
            };
            // What the runner left (or the runner itself, when the sandbox ends) goes too.
            group.signal(libc::SIGKILL);
            *stdin.lock().await = None;
            let status = match outcome {
                Ok(Ok(status)) => status,
                Ok(Err(e)) => {
                    tracing::warn!(sandbox = %self.id, "waiting for the runner failed: {e}");
                    return Ending::quiet(1);
                }
                Err(ending) => {
                    for reader in readers {
                        reader.abort();
                    }
                    let _ = child.wait().await;
                    return ending;
                }
            };
            // Everything the runner wrote goes out before the report of its death.
            for reader in readers {
                let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
            }
            if hung_up.is_cancelled() {
                return Ending::quiet(0);
            }
            let status = status
                .code()
                .unwrap_or_else(|| -status.signal().unwrap_or(0));
            let report = serde_json::json!({
                "type": "exited",
                "status": status,
                "oom": oom,
                "requested": requested,
            });
            let frame = crate::engine::protocol::encode_frame(report.to_string().as_bytes());
            if self
                .output
                .send(Ok(OutputChunk::Stdout(frame.into())))
                .await
                .is_err()
            {
                return Ending::quiet(0); // nobody listens any more
            }
            if started.elapsed() < Duration::from_secs(1) {
                // As the real supervisor: a runner that cannot start must not spin.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    fn finish(&self, ending: Ending) {
        let mut state = self.shared.lock();
        if let Some(sandbox) = state.sandboxes.get_mut(&self.id) {
            if sandbox.generation == self.generation {
                sandbox.supervisor = None;
                sandbox.exit = ExitInfo {
                    running: false,
                    exit_code: Some(ending.exit_code),
                    oom_killed: ending.oom_killed,
                    started_at: sandbox.exit.started_at.clone(),
                };
            }
        }
        drop(state);
        if let Some(done) = ending.done {
            let _ = done.send(());
        }
    }
}

impl Ending {
    /// An end nobody waits for.
    fn quiet(exit_code: i64) -> Ending {
        Ending {
            exit_code,
            oom_killed: false,
            done: None,
        }
    }
}

/// Aborts a task when dropped, so a helper task ends with the task that owns it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for a request to stop the sandbox (others mean nothing before a runner runs).
async fn next_stop(control: &mut mpsc::UnboundedReceiver<Control>) -> Ending {
    loop {
        match control.recv().await {
            Some(Control::Stop {
                exit_code,
                oom_killed,
                done,
            }) => {
                return Ending {
                    exit_code,
                    oom_killed,
                    done: Some(done),
                }
            }
            Some(_) => continue,
            None => return Ending::quiet(0),
        }
    }
}

/// One whole frame (its length prefix included), or `None` at the end of the stream.
async fn read_frame(reader: &mut (impl AsyncRead + Unpin)) -> Option<Vec<u8>> {
    let mut header = [0u8; 4];
    reader.read_exact(&mut header).await.ok()?;
    let length = u32::from_be_bytes(header) as usize;
    let mut frame = Vec::with_capacity(4 + length);
    frame.extend_from_slice(&header);
    frame.resize(4 + length, 0);
    reader.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

/// Copies the host's bytes to the live runner's stdin; cancels `hung_up` when the host closes.
async fn relay(
    mut from_host: DuplexStream,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    hung_up: CancellationToken,
) {
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = match from_host.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let mut slot = stdin.lock().await;
        if let Some(pipe) = slot.as_mut() {
            if pipe.write_all(&buffer[..read]).await.is_err() {
                *slot = None; // the runner died: its successor starts with a clean stream
            }
        }
    }
    hung_up.cancel();
}

/// Sends what the runner writes on one of its streams to the host.
fn forward(
    reader: Option<impl AsyncRead + Unpin + Send + 'static>,
    chunk: fn(Bytes) -> OutputChunk,
    output: mpsc::Sender<Result<OutputChunk, BackendError>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(mut reader) = reader else { return };
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    let bytes = Bytes::copy_from_slice(&buffer[..read]);
                    if output.send(Ok(chunk(bytes))).await.is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// The runner as a host process: the bootstrap, told it runs on the host, in a process group of
/// its own, in its workspace.
fn spawn_runner(argv: &[String], workspace: &Path) -> std::io::Result<Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "an empty command"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // The runner's IPython set, made on the host (scripts/test.sh): PCS_IPYTHON in a sandbox.
    if let Ok(dir) = std::env::var("PCS_TEST_IPYTHON") {
        command.env("PCS_IPYTHON", dir);
    }
    command.spawn()
}
