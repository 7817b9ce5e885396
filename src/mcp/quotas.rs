//! What each principal may use: live sandbox sessions, executions at once, CPU-seconds per day.
//!
//! Quotas apply to principals ([`super::principals`]) only; a server without them has its
//! global limits alone. Defaults: `SANDBOX_MAX_SESSIONS`, `SANDBOX_MAX_CONCURRENT` and
//! `SANDBOX_QUOTA_CPU_SECONDS` (unlimited when unset); a principal's own values override them.
//!
//! CPU-seconds are charged as the execution's time measured on the host times the CPUs a
//! sandbox may use (`SANDBOX_CPU_LIMIT`): an upper bound of what the code could burn, which the
//! code cannot falsify (it runs in the process that would report its own usage). Snapshots,
//! forks and restores are executions (they run the session's code). What a session's code uses
//! between calls (a thread that goes on after its call returned) is measured by the engine from
//! the container's cgroup and charged on top ([`Quotas::charge`]; see
//! `engine::sessions::CpuAccount`). A call over a quota is refused before it starts, with which
//! quota and when it frees up; the other principals are unaffected.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::principals::Principal;
use crate::config::Config;

const DAY: u64 = 24 * 60 * 60;

/// The quotas of one principal, with its overrides applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub sessions: usize,
    pub executions: usize,
    pub cpu_seconds_per_day: Option<u64>,
}

/// The quotas of every principal, and what each has used.
#[derive(Debug)]
pub struct Quotas {
    defaults: Limits,
    /// CPUs a sandbox may use: the charge per second of execution.
    cpus: f64,
    idle_timeout: Duration,
    accounts: Mutex<HashMap<String, Arc<Account>>>,
}

#[derive(Debug, Default)]
struct Account {
    running: AtomicUsize,
    /// Held while a session is counted and created, so two at once cannot both pass.
    creating: Arc<tokio::sync::Mutex<()>>,
    cpu: Mutex<CpuDay>,
}

/// CPU-seconds charged on one UTC day (days since the epoch).
#[derive(Debug, Default)]
struct CpuDay {
    day: u64,
    used: Duration,
}

impl CpuDay {
    fn used_on(&mut self, day: u64) -> Duration {
        if self.day != day {
            *self = CpuDay {
                day,
                used: Duration::ZERO,
            };
        }
        self.used
    }
}

/// A call refused because its principal is at a quota: the text says which and when it frees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OverQuota(pub String);

impl Quotas {
    pub fn new(config: &Config) -> Quotas {
        Quotas {
            defaults: Limits {
                sessions: config.sessions.max_sessions,
                executions: config.max_concurrent,
                cpu_seconds_per_day: config.http.quota_cpu_seconds_per_day,
            },
            cpus: config.limits.cpus,
            idle_timeout: config.sessions.idle_timeout,
            accounts: Mutex::default(),
        }
    }

    /// The quotas of `principal`.
    pub fn limits(&self, principal: &Principal) -> Limits {
        let own = &principal.quotas;
        Limits {
            sessions: own.sessions.unwrap_or(self.defaults.sessions),
            executions: own.executions.unwrap_or(self.defaults.executions),
            cpu_seconds_per_day: own
                .cpu_seconds_per_day
                .or(self.defaults.cpu_seconds_per_day),
        }
    }

    fn account(&self, principal: &Principal) -> Arc<Account> {
        let mut accounts = self
            .accounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        accounts.entry(principal.name.clone()).or_default().clone()
    }

    /// Starts an execution of `principal`'s, or says which quota it is at. The permit counts it
    /// as running and charges its CPU-seconds when dropped.
    pub fn start_execution(&self, principal: &Principal) -> Result<ExecutionPermit, OverQuota> {
        self.start_execution_at(principal, SystemTime::now())
    }

    fn start_execution_at(
        &self,
        principal: &Principal,
        now: SystemTime,
    ) -> Result<ExecutionPermit, OverQuota> {
        let limits = self.limits(principal);
        let account = self.account(principal);
        if let Some(limit) = limits.cpu_seconds_per_day {
            let seconds = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
            let used = lock(&account.cpu).used_on(seconds / DAY);
            if used.as_secs() >= limit {
                let left = DAY - seconds % DAY;
                return Err(OverQuota(format!(
                    "Over quota: {} has used {} of its {limit} CPU-seconds for today (UTC; \
                     charged as execution time × {} CPU). It frees up at 00:00 UTC, in {}; \
                     the operator can raise cpu_seconds_per_day.",
                    principal.name,
                    used.as_secs(),
                    self.cpus,
                    humantime::format_duration(Duration::from_secs(left / 60 * 60 + 60)),
                )));
            }
        }
        let running = account.running.fetch_add(1, Ordering::SeqCst);
        if running >= limits.executions {
            account.running.fetch_sub(1, Ordering::SeqCst);
            return Err(OverQuota(format!(
                "Over quota: {} already has {running} executions running, the most it may run \
                 at once ({}). One frees up when a running call returns: retry then.",
                principal.name, limits.executions
            )));
        }
        Ok(ExecutionPermit {
            account,
            started: Instant::now(),
            cpus: self.cpus,
        })
    }

    /// Holds `principal`'s session creation while `live` (its sessions now) is checked against
    /// its quota and a session is created: the guard, or which quota it is at.
    pub async fn session_slot(
        &self,
        principal: &Principal,
        live: impl FnOnce() -> usize,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, OverQuota> {
        let limit = self.limits(principal).sessions;
        let guard = self.account(principal).creating.clone().lock_owned().await;
        let live = live();
        if live >= limit {
            return Err(OverQuota(format!(
                "Over quota: {} has {live} live sandbox sessions, the most it may keep ({limit}). \
                 One frees up when you stop one (sandbox_stop; sandbox_list shows yours) or when \
                 one ends after {} without a call.",
                principal.name,
                humantime::format_duration(self.idle_timeout)
            )));
        }
        Ok(guard)
    }

    /// Charges `principal` CPU time its sessions used outside its calls, as the engine measured
    /// it (their code's threads and processes that go on after a call returned).
    pub fn charge(&self, principal: &Principal, cpu: Duration) {
        if cpu.is_zero() {
            return;
        }
        let day = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            / DAY;
        let account = self.account(principal);
        let mut used = lock(&account.cpu);
        used.used_on(day);
        used.used += cpu;
    }

    /// The CPU-seconds `principal` has been charged today (UTC).
    pub fn cpu_used_today(&self, principal: &Principal) -> Duration {
        let day = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            / DAY;
        lock(&self.account(principal).cpu).used_on(day)
    }
}

/// A running execution of a principal's: counted until dropped, then charged.
#[derive(Debug)]
pub struct ExecutionPermit {
    account: Arc<Account>,
    started: Instant,
    cpus: f64,
}

impl Drop for ExecutionPermit {
    fn drop(&mut self) {
        self.account.running.fetch_sub(1, Ordering::SeqCst);
        let charge = self.started.elapsed().mul_f64(self.cpus.max(0.0));
        let day = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs()
            / DAY;
        let mut cpu = lock(&self.account.cpu);
        cpu.used_on(day);
        cpu.used += charge;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::principals::QuotaOverrides;

    fn quotas() -> Quotas {
        let mut config = Config::default();
        config.sessions.max_sessions = 3;
        config.max_concurrent = 2;
        config.limits.cpus = 1.0;
        Quotas::new(&config)
    }

    fn principal(name: &str, overrides: QuotaOverrides) -> Principal {
        Principal {
            quotas: overrides,
            ..Principal::new(name)
        }
    }

    #[test]
    fn defaults_come_from_the_global_limits_and_a_principal_overrides_them() {
        let q = quotas();
        let plain = principal("a", QuotaOverrides::default());
        assert_eq!(
            q.limits(&plain),
            Limits {
                sessions: 3,
                executions: 2,
                cpu_seconds_per_day: None
            }
        );
        let own = principal(
            "b",
            QuotaOverrides {
                sessions: Some(1),
                executions: None,
                cpu_seconds_per_day: Some(5),
            },
        );
        assert_eq!(
            q.limits(&own),
            Limits {
                sessions: 1,
                executions: 2,
                cpu_seconds_per_day: Some(5)
            }
        );
    }

    #[test]
    fn executions_at_once_are_counted_per_principal() {
        let q = quotas();
        let a = principal("a", QuotaOverrides::default());
        let b = principal("b", QuotaOverrides::default());
        let first = q.start_execution(&a).unwrap();
        let _second = q.start_execution(&a).unwrap();
        let over = q.start_execution(&a).unwrap_err();
        assert!(over.0.contains("at once (2)"), "{over}");
        // Another principal is not affected.
        let _other = q.start_execution(&b).unwrap();
        drop(first);
        assert!(q.start_execution(&a).is_ok());
    }

    #[test]
    fn cpu_seconds_are_charged_and_free_up_the_next_utc_day() {
        let q = quotas();
        let a = principal(
            "a",
            QuotaOverrides {
                cpu_seconds_per_day: Some(10),
                ..QuotaOverrides::default()
            },
        );
        let now = SystemTime::now();
        let day = now.duration_since(UNIX_EPOCH).unwrap().as_secs() / DAY;
        {
            let account = q.account(&a);
            let mut cpu = lock(&account.cpu);
            cpu.used_on(day);
            cpu.used = Duration::from_secs(10);
        }
        let over = q.start_execution_at(&a, now).unwrap_err();
        assert!(over.0.contains("10 of its 10 CPU-seconds"), "{over}");
        assert!(over.0.contains("00:00 UTC"), "{over}");
        let tomorrow = now + Duration::from_secs(DAY);
        assert!(q.start_execution_at(&a, tomorrow).is_ok());
    }

    #[test]
    fn a_permit_charges_its_time_times_the_cpus() {
        let q = quotas();
        let a = principal("a", QuotaOverrides::default());
        let permit = q.start_execution(&a).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(permit);
        assert!(q.cpu_used_today(&a) >= Duration::from_millis(20));
        assert_eq!(q.account(&a).running.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn cpu_used_between_calls_is_charged_and_counts_against_the_quota() {
        let q = quotas();
        let a = principal(
            "a",
            QuotaOverrides {
                cpu_seconds_per_day: Some(2),
                ..QuotaOverrides::default()
            },
        );
        q.charge(&a, Duration::ZERO);
        assert!(q.start_execution(&a).is_ok());
        q.charge(&a, Duration::from_millis(2500));
        assert!(q.cpu_used_today(&a) >= Duration::from_millis(2500));
        let over = q.start_execution(&a).unwrap_err();
        assert!(over.0.contains("2 of its 2 CPU-seconds"), "{over}");
    }

    #[tokio::test]
    async fn sessions_over_the_quota_are_refused_with_how_to_free_one() {
        let q = quotas();
        let a = principal("a", QuotaOverrides::default());
        assert!(q.session_slot(&a, || 2).await.is_ok());
        let over = q.session_slot(&a, || 3).await.unwrap_err();
        assert!(over.0.contains("sandbox_stop"), "{over}");
    }
}
