//! The key under which an install is published in the dependency cache.

use sha2::{Digest, Sha256};

use super::command::IndexConfig;
use super::requirement::Requirement;

/// The cache key of an install: `d-` and the first 32 hex digits of a SHA-256 over a
/// length-prefixed serialization of the image id, the installer, the index configuration and the
/// sorted, deduplicated canonical requirements. Safe as a directory name; independent of the
/// order of `requirements`.
pub fn cache_key(
    image_id: &str,
    requirements: &[Requirement],
    index: &IndexConfig,
    installer: &str,
) -> String {
    fn field(hasher: &mut Sha256, bytes: &[u8]) {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    }
    fn optional(hasher: &mut Sha256, value: Option<&str>) {
        match value {
            Some(value) => {
                hasher.update([1u8]);
                field(hasher, value.as_bytes());
            }
            None => hasher.update([0u8]),
        }
    }
    let mut canonical: Vec<String> = requirements.iter().map(Requirement::canonical).collect();
    canonical.sort();
    canonical.dedup();

    let mut hasher = Sha256::new();
    field(&mut hasher, b"python-code-sandbox/deps/v1");
    field(&mut hasher, image_id.as_bytes());
    field(&mut hasher, installer.as_bytes());
    optional(&mut hasher, index.index_url.as_deref());
    hasher.update((index.extra_index_urls.len() as u64).to_be_bytes());
    for url in &index.extra_index_urls {
        field(&mut hasher, url.as_bytes());
    }
    optional(&mut hasher, index.ca_bundle_digest.as_deref());
    hasher.update([u8::from(index.allow_source_builds)]);
    hasher.update((canonical.len() as u64).to_be_bytes());
    for requirement in &canonical {
        field(&mut hasher, requirement.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = String::with_capacity(34);
    key.push_str("d-");
    for byte in digest.iter().take(16) {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    key
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::deps::tests::reqs;

    #[test]
    fn cache_key_shape() {
        let key = cache_key(
            "sha256:abc",
            &reqs(&["numpy"]),
            &IndexConfig::default(),
            "pip",
        );
        assert_eq!(key.len(), 34);
        assert!(key.starts_with("d-"));
        assert!(key[2..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    }

    #[test]
    fn cache_key_is_stable_and_order_independent() {
        let index = IndexConfig::default();
        let a = cache_key("img", &reqs(&["numpy", "pandas>=2"]), &index, "pip");
        let b = cache_key("img", &reqs(&["pandas >= 2", "NumPy"]), &index, "pip");
        let c = cache_key(
            "img",
            &reqs(&["pandas>=2", "numpy", "numpy"]),
            &index,
            "pip",
        );
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            a,
            cache_key("img", &reqs(&["numpy", "pandas>=2"]), &index, "pip")
        );
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let index = IndexConfig::default();
        let base = cache_key("img", &reqs(&["numpy"]), &index, "pip");
        let mut keys = vec![
            base.clone(),
            cache_key("img2", &reqs(&["numpy"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy==1"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy[x]"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy; os_name == 'nt'"]), &index, "pip"),
            cache_key("img", &reqs(&["numpy", "six"]), &index, "pip"),
            cache_key("img", &[], &index, "pip"),
            cache_key("img", &reqs(&["numpy"]), &index, "uv"),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    index_url: Some("https://mirror/simple".into()),
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    extra_index_urls: vec!["https://mirror/simple".into()],
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    ca_bundle_digest: Some("sha256:ca".into()),
                    ..IndexConfig::default()
                },
                "pip",
            ),
            cache_key(
                "img",
                &reqs(&["numpy"]),
                &IndexConfig {
                    allow_source_builds: true,
                    ..IndexConfig::default()
                },
                "pip",
            ),
        ];
        let count = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), count, "every input change must change the key");
    }

    #[test]
    fn cache_key_fields_are_unambiguous() {
        let index = IndexConfig::default();
        // Moving bytes between fields must not collide.
        assert_ne!(
            cache_key("ab", &[], &index, "c"),
            cache_key("a", &[], &index, "bc")
        );
        let url_in_index = IndexConfig {
            index_url: Some("u".into()),
            ..IndexConfig::default()
        };
        let url_in_extra = IndexConfig {
            extra_index_urls: vec!["u".into()],
            ..IndexConfig::default()
        };
        assert_ne!(
            cache_key("img", &[], &url_in_index, "pip"),
            cache_key("img", &[], &url_in_extra, "pip")
        );
        let two_extras = IndexConfig {
            extra_index_urls: vec!["a".into(), "b".into()],
            ..IndexConfig::default()
        };
        let swapped = IndexConfig {
            extra_index_urls: vec!["b".into(), "a".into()],
            ..IndexConfig::default()
        };
        assert_ne!(
            cache_key("img", &[], &two_extras, "pip"),
            cache_key("img", &[], &swapped, "pip"),
            "index order matters to uv"
        );
    }
}
