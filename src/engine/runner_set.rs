//! The runner's own IPython: the pinned, hashed set in `python/ipython-set.txt`, installed once per
//! image into the dependency cache like a dependency set (by the server, for itself: whether or
//! not agents may ask for dependencies), and named to every code sandbox's runner by the
//! environment variable [`ENV_VAR`]. The runner imports IPython from there before it says it is
//! ready, and says so in its `ready` frame; what the host makes of that is [`check`]. Pure logic.

use sha2::{Digest, Sha256};

/// The lock: every package IPython needs, pinned, with the hashes of its wheels (a pip
/// requirements file, installed with `--require-hashes --no-deps`).
pub const LOCK: &str = include_str!("python/ipython-set.txt");

/// Tells a code sandbox's runner where the set is (the absolute path of its directory).
pub const ENV_VAR: &str = "PCS_IPYTHON";

/// The label of an image that carries the set (the sandbox image: `image build` installs it at
/// `paths::BAKED_IPYTHON`): the set's [`digest`]. Such an image needs no install.
pub const IMAGE_LABEL: &str = "io.python-code-sandbox.ipython";

/// The digest of the lock as an image's [`IMAGE_LABEL`] carries it.
pub fn digest() -> String {
    let digest = Sha256::digest(LOCK.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Whether an image's labels say it carries this very set.
pub fn carried_by(labels: &std::collections::HashMap<String, String>) -> bool {
    labels.get(IMAGE_LABEL).is_some_and(|d| *d == digest())
}

/// What progress says while the set is installed.
pub const INSTALLING: &str = "installing the runner's IPython (once per image)";

/// The key the set of `image_id` is published under: shaped like a dependency set's key (`d-` and
/// 32 hex digits; the cache's maintenance knows no other), from the image, the layout sets are
/// published as, and the lock's content, so that a new lock is a new set. The index settings are
/// not part of it: the hashes fix every file whichever index serves it.
pub fn cache_key(image_id: &str, layout: &str, lock: &str) -> String {
    let mut hasher = Sha256::new();
    for field in [
        "python-code-sandbox/runner-ipython/v1",
        image_id,
        layout,
        lock,
    ] {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("d-{hex}")
}

/// How the cache lists the set (`cache list`, its manifest): this, then the IPython it pins.
pub const LISTED_AS: &str = "(the runner's own)";

/// The pins of the lock (`name==version`), in its order.
fn pins(lock: &str) -> impl Iterator<Item = &str> {
    lock.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
}

/// What the cache lists the set as: one entry, [`LISTED_AS`] and its IPython's pin.
pub fn listed(lock: &str) -> Vec<String> {
    let ipython = pins(lock)
        .find(|p| p.starts_with("ipython=="))
        .unwrap_or("ipython");
    vec![format!("{LISTED_AS} {ipython}")]
}

/// Whether a cached set listed with `requirements` is a runner's set.
pub fn is_listed_as(requirements: &[String]) -> bool {
    requirements
        .first()
        .is_some_and(|r| r.starts_with(LISTED_AS))
}

/// The names of the lock's projects (for the words of a failed install): the lock writes them
/// normalized (lowercase, `-` between words), as the test below checks.
pub fn projects(lock: &str) -> Vec<String> {
    pins(lock)
        .filter_map(|pin| pin.split("==").next())
        .map(String::from)
        .collect()
}

/// The environment entry that names the set's directory to a runner.
pub fn env_entry(dir: &str) -> String {
    format!("{ENV_VAR}={dir}")
}

/// Whether a sandbox spec's environment names the set (a code sandbox's does).
pub fn is_named_in(env: &[String]) -> bool {
    env.iter()
        .any(|e| e.split_once('=').is_some_and(|(name, _)| name == ENV_VAR))
}

/// What a runner's `ready` frame said of its IPython (untrusted; bounded by the parser).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RunnerIpython {
    /// It imported IPython: this version.
    Imported(String),
    /// It could not: why, in its words.
    Failed(String),
    /// Neither: a runner that predates IPython (or was told of no set).
    #[default]
    Unsaid,
}

/// Whether a runner may run code: one told of the set ([`ENV_VAR`] was in its environment) must
/// have imported it; one not told of it (installers, maintenance) runs only the project's own
/// scripts, and what it says of IPython does not matter. The error is why not, for
/// `EngineError::RunnerIpython`.
pub fn check(told: bool, said: &RunnerIpython) -> Result<(), String> {
    match (told, said) {
        (false, _) | (true, RunnerIpython::Imported(_)) => Ok(()),
        (true, RunnerIpython::Failed(why)) => Err(why.clone()),
        (true, RunnerIpython::Unsaid) => Err(format!(
            "the runner was given the set ({ENV_VAR}) but did not say whether it imported it \
             (a runner older than the server?)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_a_cache_key_of_the_image_and_the_lock() {
        let key = cache_key("sha256:img", "layout", LOCK);
        assert!(
            key.len() == 34
                && key.starts_with("d-")
                && key[2..]
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{key}"
        );
        assert_eq!(key, cache_key("sha256:img", "layout", LOCK), "stable");
        let mut keys = vec![
            key,
            cache_key("sha256:other", "layout", LOCK),
            cache_key("sha256:img", "layout2", LOCK),
            cache_key("sha256:img", "layout", &format!("{LOCK}x==1\n")),
            // Bytes moved between fields do not collide.
            cache_key("sha256:im", "glayout", LOCK),
        ];
        let count = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), count, "every input changes the key");
    }

    #[test]
    fn the_lock_pins_ipython_with_hashes() {
        let listed = listed(LOCK);
        assert_eq!(listed, ["(the runner's own) ipython==9.18.1"]);
        assert!(is_listed_as(&listed));
        assert!(!is_listed_as(&["ipython==9.18.1".to_string()]) && !is_listed_as(&[]));
        let entries: Vec<&str> = LOCK
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .collect();
        for entry in &entries {
            assert!(entry.contains("--hash=sha256:"), "unhashed: {entry}");
            assert!(
                entry.split_whitespace().next().unwrap().contains("=="),
                "unpinned: {entry}"
            );
        }
        let projects = projects(LOCK);
        for project in &projects {
            assert_eq!(*project, crate::engine::deps::normalize_name(project));
        }
        assert!(projects.contains(&"ipython".to_string()));
        assert!(projects.contains(&"prompt-toolkit".to_string()));
        assert_eq!(projects.len(), entries.len());
    }

    #[test]
    fn an_image_carries_the_set_only_with_this_locks_digest() {
        let labels = |d: &str| std::collections::HashMap::from([(IMAGE_LABEL.into(), d.into())]);
        assert!(carried_by(&labels(&digest())));
        assert!(!carried_by(&labels("0123456789abcdef")));
        assert!(!carried_by(&Default::default()));
        assert_eq!(digest().len(), 16);
    }

    #[test]
    fn the_environment_names_the_set() {
        let entry = env_entry("/opt/deps/s-0123");
        assert_eq!(entry, "PCS_IPYTHON=/opt/deps/s-0123");
        assert!(is_named_in(&["A=1".into(), entry]));
        assert!(!is_named_in(&[
            "PCS_IPYTHON_X=1".into(),
            "A=PCS_IPYTHON=1".into()
        ]));
    }

    #[test]
    fn a_runner_told_of_the_set_runs_code_only_when_it_imported_it() {
        let imported = RunnerIpython::Imported("9.18.1".into());
        let failed = RunnerIpython::Failed("No module named 'IPython'".into());
        assert_eq!(check(true, &imported), Ok(()));
        assert_eq!(
            check(true, &failed),
            Err("No module named 'IPython'".to_string())
        );
        let unsaid = check(true, &RunnerIpython::Unsaid).unwrap_err();
        assert!(
            unsaid.contains("PCS_IPYTHON") && unsaid.contains("did not say"),
            "{unsaid}"
        );
        // Not told (installers, maintenance, a runner before IPython): whatever it says.
        for said in [imported, failed, RunnerIpython::Unsaid] {
            assert_eq!(check(false, &said), Ok(()));
        }
    }
}
