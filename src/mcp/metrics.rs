//! The server's Prometheus metrics (`GET /metrics` of `serve --http`, text format 0.0.4).
//!
//! One registry per process ([`global`]): tool calls are counted where every call passes
//! ([`super::audit`]), the engine's events (sandbox start-up times, bytes copied out) arrive
//! through its observer ([`crate::engine::stats`]), and what the engine holds now (live sessions,
//! the warm pool, installs it ran) is read from it when the metrics are scraped.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `sandbox_tool_calls_total` | counter | `tool` (a tool the server has, or `<unknown>`), `outcome` (ok, error, timeout, out_of_memory, cancelled) |
//! | `sandbox_tool_call_duration_seconds` | histogram | `tool` |
//! | `sandbox_tool_calls_in_flight` | gauge | |
//! | `sandbox_principal_tool_calls_total` | counter | `principal` (`anonymous` without one) |
//! | `sandbox_startup_duration_seconds` | histogram | |
//! | `sandbox_sessions_live` | gauge | |
//! | `sandbox_pool_ready` | gauge | `set` (`default`: the plain pool; `roots`: prepared for clients' roots; else the set's requirements) |
//! | `sandbox_dependency_installs_total` | counter | |
//! | `sandbox_dependency_cache_hits_total` | counter | |
//! | `sandbox_copied_out_bytes_total` | counter | |
//! | `sandbox_sandboxes_live` | gauge | |
//! | `sandbox_sandboxes_max` | gauge | |
//! | `sandbox_admission_queue_length` | gauge | |
//! | `sandbox_admission_refused_total` | counter | |
//! | `sandbox_start_retries_total` | counter | |
//! | `sandbox_recycled_ready` | gauge | |
//!
//! Labels never carry a client's text: a `tool` label is a [`ToolLabel`], made only from the
//! server's own tool names, and every other name a client calls is counted as `<unknown>`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::engine::sessions::Scope;
use crate::engine::Engine;

/// Where the metrics are served.
pub const METRICS_PATH: &str = "/metrics";

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The principal label of a call with no principal.
pub const ANONYMOUS: &str = "anonymous";

/// How a tool call ended, as the `outcome` label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
    Timeout,
    OutOfMemory,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::OutOfMemory => "out_of_memory",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// The `tool` label of calls of a tool the server does not have, whatever name they gave.
pub const UNKNOWN_TOOL: &str = "<unknown>";

/// The longest tool name looked up (MCP: tool names should be 1 to 128 characters); longer ones
/// are unknown without a look-up.
pub const MAX_TOOL_NAME: usize = 128;

/// The `tool` label of a call: the name of one of the server's tools, or [`UNKNOWN_TOOL`]. It is
/// made only by [`ToolLabel::of`] from the server's tools (or as unknown), so the labels are a
/// fixed, small set whatever clients send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLabel(Option<Cow<'static, str>>);

impl ToolLabel {
    /// The label of a call of `name` among `tools` (the server's router): the tool's own name
    /// when it has one of that name, else unknown.
    pub fn of<S: Send + Sync + 'static>(
        tools: &rmcp::handler::server::router::tool::ToolRouter<S>,
        name: &str,
    ) -> Self {
        if name.len() > MAX_TOOL_NAME {
            return ToolLabel::unknown();
        }
        ToolLabel(tools.get(name).map(|tool| tool.name.clone()))
    }

    /// The label of every name that is not one of the server's tools.
    pub fn unknown() -> Self {
        ToolLabel(None)
    }

    pub fn is_known(&self) -> bool {
        self.0.is_some()
    }

    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or(UNKNOWN_TOOL)
    }
}

type Labels2 = [(&'static str, String); 2];
type Labels1 = [(&'static str, String); 1];

const CALL_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const STARTUP_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}

/// The server's capacity now (`engine::admission`), read from the engine when scraped.
#[derive(Default)]
struct Capacity {
    live: Gauge,
    max: Gauge,
    queue: Gauge,
    refused: Counter,
    retries: Counter,
    recycled: Gauge,
}

impl Capacity {
    fn register(registry: &mut Registry) -> Capacity {
        let capacity = Capacity::default();
        registry.register(
            "sandbox_sandboxes_live",
            "Sandboxes for the agent's code holding a share of the server's capacity",
            capacity.live.clone(),
        );
        registry.register(
            "sandbox_sandboxes_max",
            "The most such sandboxes at once (SANDBOX_MAX_SANDBOXES or computed from the host)",
            capacity.max.clone(),
        );
        registry.register(
            "sandbox_admission_queue_length",
            "Calls waiting for a sandbox",
            capacity.queue.clone(),
        );
        registry.register(
            "sandbox_admission_refused",
            "Calls refused a sandbox (the queue full, or none free within their wait)",
            capacity.refused.clone(),
        );
        registry.register(
            "sandbox_start_retries",
            "Sandbox starts tried again after a passing failure",
            capacity.retries.clone(),
        );
        registry.register(
            "sandbox_recycled_ready",
            "Sandboxes a run used, emptied, waiting for the same client's next run",
            capacity.recycled.clone(),
        );
        capacity
    }

    fn set(&self, state: &crate::engine::admission::State) {
        self.live.set(state.live as i64);
        self.max.set(state.limit as i64);
        self.queue.set(state.waiting as i64);
        self.refused
            .inc_by(state.refused.saturating_sub(self.refused.get()));
        self.retries
            .inc_by(state.retried.saturating_sub(self.retries.get()));
        self.recycled.set(state.recycled as i64);
    }
}

pub struct Metrics {
    registry: Registry,
    calls: Family<Labels2, Counter>,
    call_seconds: Family<Labels1, Histogram, fn() -> Histogram>,
    in_flight: Gauge,
    by_principal: Family<Labels1, Counter>,
    startup_seconds: Histogram,
    sessions_live: Gauge,
    pool_ready: Family<Labels1, Gauge>,
    installs: Counter,
    cache_hits: Counter,
    copied_out: Counter,
    secrets_used: Family<Labels2, Counter>,
    capacity: Capacity,
    /// Serializes scrapes: the values read from the engine are set, then encoded.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let calls = Family::<Labels2, Counter>::default();
        registry.register(
            "sandbox_tool_calls",
            "Tool calls by tool and outcome (ok, error, timeout, out_of_memory, cancelled)",
            calls.clone(),
        );
        let call_seconds = Family::<Labels1, Histogram, fn() -> Histogram>::new_with_constructor(
            call_histogram as fn() -> Histogram,
        );
        registry.register(
            "sandbox_tool_call_duration_seconds",
            "How long tool calls took, by tool",
            call_seconds.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "sandbox_tool_calls_in_flight",
            "Tool calls in progress",
            in_flight.clone(),
        );
        let by_principal = Family::<Labels1, Counter>::default();
        registry.register(
            "sandbox_principal_tool_calls",
            "Tool calls by principal (anonymous: no principal)",
            by_principal.clone(),
        );
        let startup_seconds = Histogram::new(STARTUP_BUCKETS);
        registry.register(
            "sandbox_startup_duration_seconds",
            "How long sandboxes took from the request to create them until their runner answered",
            startup_seconds.clone(),
        );
        let sessions_live = Gauge::default();
        registry.register(
            "sandbox_sessions_live",
            "Live sandbox sessions",
            sessions_live.clone(),
        );
        let pool_ready = Family::<Labels1, Gauge>::default();
        registry.register(
            "sandbox_pool_ready",
            "Warm sandboxes waiting, by dependency set (default: the plain pool)",
            pool_ready.clone(),
        );
        let installs = Counter::default();
        registry.register(
            "sandbox_dependency_installs",
            "Dependency installers the engine ran",
            installs.clone(),
        );
        let cache_hits = Counter::default();
        registry.register(
            "sandbox_dependency_cache_hits",
            "Calls whose dependencies came from the cache without an install",
            cache_hits.clone(),
        );
        let copied_out = Counter::default();
        registry.register(
            "sandbox_copied_out_bytes",
            "Bytes of workspace files copied out of sandboxes",
            copied_out.clone(),
        );
        let secrets_used = Family::<Labels2, Counter>::default();
        registry.register(
            "sandbox_egress_secret_uses",
            "Requests the egress proxy added a secret to, by secret (its name) and host",
            secrets_used.clone(),
        );
        let capacity = Capacity::register(&mut registry);
        Metrics {
            secrets_used,
            capacity,
            registry,
            calls,
            call_seconds,
            in_flight,
            by_principal,
            startup_seconds,
            sessions_live,
            pool_ready,
            installs,
            cache_hits,
            copied_out,
            scrape: Mutex::new(()),
        }
    }

    /// A tool call started; [`Metrics::call_ended`] follows.
    pub fn call_started(&self) {
        self.in_flight.inc();
    }

    /// A tool call ended: counted by tool, outcome and principal, its duration observed.
    pub fn call_ended(&self, tool: &ToolLabel, outcome: Outcome, principal: &str, took: Duration) {
        self.in_flight.dec();
        let tool = tool.as_str();
        self.calls
            .get_or_create(&[
                ("tool", tool.to_string()),
                ("outcome", outcome.as_str().to_string()),
            ])
            .inc();
        self.call_seconds
            .get_or_create(&[("tool", tool.to_string())])
            .observe(took.as_secs_f64());
        self.by_principal
            .get_or_create(&[("principal", principal.to_string())])
            .inc();
    }

    /// A call's dependencies came from the cache.
    pub fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    /// Tool calls in progress now.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// The metrics in Prometheus text format, with what the engine holds now.
    pub fn render(&self, engine: &Engine) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.sessions_live
            .set(engine.sessions(Scope::Server).len() as i64);
        let installs = engine.installs_started();
        self.installs
            .inc_by(installs.saturating_sub(self.installs.get()));
        let mut sets: BTreeMap<String, i64> = BTreeMap::new();
        sets.insert("default".to_string(), engine.pool_ready() as i64);
        for (requirements, _) in engine.prepared_sets() {
            // A set without requirements is a client's roots (no host path in a label).
            let set = match requirements.is_empty() {
                true => "roots".to_string(),
                false => requirements.join(" "),
            };
            *sets.entry(set).or_default() += 1;
        }
        self.pool_ready.clear();
        for (set, ready) in sets {
            self.pool_ready.get_or_create(&[("set", set)]).set(ready);
        }
        if let Some(state) = engine.admission_state() {
            self.capacity.set(&state);
        }
        self.encode()
    }

    fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

impl crate::engine::stats::Observer for Metrics {
    fn sandbox_started(&self, took: Duration) {
        self.startup_seconds.observe(took.as_secs_f64());
    }

    fn copied_out(&self, bytes: u64) {
        self.copied_out.inc_by(bytes);
    }

    fn secret_used(&self, secret: &str, host: &str) {
        self.secrets_used
            .get_or_create(&[("secret", secret.to_string()), ("host", host.to_string())])
            .inc();
    }
}

static GLOBAL: LazyLock<Arc<Metrics>> = LazyLock::new(|| {
    let metrics = Arc::new(Metrics::new());
    crate::engine::stats::observe(metrics.clone());
    metrics
});

/// `GET /metrics`: the process's metrics, with what `engine` holds now.
pub fn routes(engine: Arc<Engine>) -> axum::Router {
    axum::Router::new()
        .route(METRICS_PATH, axum::routing::get(scrape))
        .with_state(engine)
}

async fn scrape(
    axum::extract::State(engine): axum::extract::State<Arc<Engine>>,
) -> axum::response::Response {
    // The metrics name every principal: with principals, only an admin reads them here.
    if super::principals::current().is_some_and(|caller| !caller.admin) {
        let mut refused = axum::response::Response::new(axum::body::Body::from(
            "Forbidden: /metrics names every principal; it needs an admin principal (`admin` in \
             the tokens file, scope sandbox:admin), or the operator serves it on \
             SANDBOX_METRICS_ADDR\n",
        ));
        *refused.status_mut() = axum::http::StatusCode::FORBIDDEN;
        return refused;
    }
    let mut response =
        axum::response::Response::new(axum::body::Body::from(global().render(&engine)));
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
}

/// The process's metrics (made, and made the engine's observer, at first use).
pub fn global() -> &'static Metrics {
    &GLOBAL
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::stats::Observer;

    fn label(name: &str) -> ToolLabel {
        ToolLabel::of(&crate::mcp::server::SandboxServer::tools(), name)
    }

    #[test]
    fn only_the_servers_tools_become_labels() {
        assert_eq!(label("run_python").as_str(), "run_python");
        assert!(label("sandbox_stop").is_known());
        for name in [
            "",
            "run_python ",
            "Run_Python",
            "run_python\n",
            "evil\u{1b}[31m",
            &"x".repeat(64 << 10),
            &format!("run_python{}", " ".repeat(MAX_TOOL_NAME)),
        ] {
            let unknown = label(name);
            assert_eq!(
                (unknown.is_known(), unknown.as_str()),
                (false, UNKNOWN_TOOL)
            );
        }
        // Unknown names, however many and however long, add one label: `<unknown>`.
        let metrics = Metrics::new();
        for i in 0..20 {
            let name = format!("{i}{}", "y".repeat(64 << 10));
            metrics.call_started();
            metrics.call_ended(&label(&name), Outcome::Error, ANONYMOUS, Duration::ZERO);
        }
        let text = metrics.encode();
        assert!(
            text.lines()
                .any(|l| l == "sandbox_tool_calls_total{tool=\"<unknown>\",outcome=\"error\"} 20"),
            "{text}"
        );
        assert!(
            !text.contains("yyyy") && text.len() < 16 << 10,
            "{} bytes",
            text.len()
        );
    }

    #[test]
    fn calls_are_counted_by_tool_outcome_and_principal() {
        let metrics = Metrics::new();
        metrics.call_started();
        metrics.call_started();
        assert_eq!(metrics.in_flight(), 2);
        metrics.call_ended(
            &label("run_python"),
            Outcome::Ok,
            "alice",
            Duration::from_millis(30),
        );
        metrics.call_ended(
            &label("run_python"),
            Outcome::Timeout,
            ANONYMOUS,
            Duration::from_secs(2),
        );
        metrics.sandbox_started(Duration::from_millis(300));
        metrics.copied_out(1234);
        metrics.cache_hit();
        metrics.secret_used("llm", "api.example.test");
        assert_eq!(metrics.in_flight(), 0);
        let text = metrics.encode();
        for line in [
            "sandbox_tool_calls_total{tool=\"run_python\",outcome=\"ok\"} 1",
            "sandbox_tool_calls_total{tool=\"run_python\",outcome=\"timeout\"} 1",
            "sandbox_principal_tool_calls_total{principal=\"alice\"} 1",
            "sandbox_principal_tool_calls_total{principal=\"anonymous\"} 1",
            "sandbox_tool_call_duration_seconds_count{tool=\"run_python\"} 2",
            "sandbox_tool_call_duration_seconds_bucket{tool=\"run_python\",le=\"0.05\"} 1",
            "sandbox_startup_duration_seconds_count 1",
            "sandbox_copied_out_bytes_total 1234",
            "sandbox_dependency_cache_hits_total 1",
            "sandbox_egress_secret_uses_total{secret=\"llm\",host=\"api.example.test\"} 1",
            "sandbox_tool_calls_in_flight 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in\n{text}"
            );
        }
        assert!(
            text.contains("# TYPE sandbox_tool_calls_total counter"),
            "{text}"
        );
    }

    #[test]
    fn outcome_labels_are_the_documented_ones() {
        let labels: Vec<&str> = [
            Outcome::Ok,
            Outcome::Error,
            Outcome::Timeout,
            Outcome::OutOfMemory,
            Outcome::Cancelled,
        ]
        .into_iter()
        .map(Outcome::as_str)
        .collect();
        assert_eq!(
            labels,
            ["ok", "error", "timeout", "out_of_memory", "cancelled"]
        );
    }
}
