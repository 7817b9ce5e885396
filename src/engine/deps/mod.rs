//! Per-run Python dependencies: validation, cache keys, installer command lines, why an install
//! failed and the setting that fixes it, eviction.
//!
//! Agents ask for packages as a list of strings. The original project joined them into a shell
//! `pip install ...`, which let an agent inject pip options (`--index-url=...`) or shell commands.
//! Here every entry is parsed as a strict subset of PEP 508 (a name, extras, version specifiers
//! and a restricted environment marker; no options, paths or URLs unless the operator allows
//! `name @ url`), and only the re-serialized canonical form is ever passed on, each requirement as
//! its own argv element after `--`, never through a shell. Validation is the safety boundary.
//!
//! Installs run in a separate short-lived installer container into `--target <dir>` (wheels
//! only unless the operator allows source builds), and are published under [`cache_key`] (a hash
//! of the image, the requirements, the index settings and the installer) into the cache that
//! sandboxes mount read-only (see `installer`).
//! [`select_evictions`] picks least-recently-used cache entries to remove when the cache is full.
//!
//! This module is pure logic: no I/O, no Docker.

mod cache_key;
mod command;
mod eviction;
mod failure;
mod marker;
mod pip_line;
mod remedy;
mod requirement;
mod summary;

pub use cache_key::cache_key;
pub use command::{
    installer_argv, locked_installer_argv, pip_with_options, plain_http_hosts, IndexConfig,
    Installer, DEFAULT_INDEX_HOSTS,
};
pub use eviction::{select_evictions, CacheEntry};
pub use failure::{
    classify, split_diagnosis, Evidence, FailureKind, InstallFailure, Route, Setting,
    DIAGNOSIS_MARK,
};
pub use marker::MARKER_VARIABLES;
pub use pip_line::{parse_pip_line, PipCommand, PipRefusal, MAX_LINE_BYTES as MAX_PIP_LINE_BYTES};
pub use remedy::{remedy, CaBundles, Remedy};
pub use requirement::{
    normalize_name, parse_requirement, parse_requirements, DependencyError, Requirement,
    MAX_DEPENDENCIES, MAX_ENTRY_LEN,
};
pub use summary::{installer_error_summary, strip_ansi};

#[cfg(test)]
pub(crate) mod tests {
    use super::{parse_requirement, Requirement};

    /// Requirements the tests write as PEP 508 strings.
    pub(crate) fn reqs(entries: &[&str]) -> Vec<Requirement> {
        entries
            .iter()
            .map(|e| parse_requirement(e, false).unwrap())
            .collect()
    }
}
