//! The fetching stage of a two-stage build: the first stage of the sandbox image's recipe and of
//! a flavour's reaches the package index with the configured index (`PIP_INDEX_URL`,
//! `PIP_EXTRA_INDEX_URL`) and CA bundle (`SANDBOX_CA_BUNDLE`, by default the host's own) in a pip
//! configuration file of the build context; the second stage copies only what was installed.
//! Neither the configuration (an index URL may hold credentials) nor the bundle reaches the image
//! or its history: the first stage's images carry a label with the build's id and are removed
//! after the build, whether it succeeded or not.

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::query_parameters::{ListImagesOptions, RemoveImageOptions};
use bollard::Docker;

use super::ImageError;
use crate::config::Config;
use crate::engine::deps::IndexConfig;

/// The index pip uses when `PIP_INDEX_URL` is not set.
pub(super) const PYPI: &str = "https://pypi.org/simple";
/// Seconds pip waits for the index before giving up on a connection.
const INDEX_TIMEOUT_SECS: u32 = 15;
/// pip's retries of a failed connection: one, so that an index that does not answer fails the
/// build in seconds, not minutes (the recipe says why).
const INDEX_RETRIES: u32 = 1;
/// Label of the first stage's images, so they can be found and removed after the build.
pub(super) const BUILD_LABEL: &str = "io.python-code-sandbox.fetch-build";

/// Where packages come from, as configured (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`,
/// `SANDBOX_CA_BUNDLE`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    pub index_url: Option<String>,
    pub extra_index_urls: Vec<String>,
    pub ca_bundle: Option<PathBuf>,
}

impl Index {
    pub fn from_config(config: &Config) -> Index {
        Index {
            index_url: config.deps.index_url.clone(),
            extra_index_urls: config.deps.extra_index_urls.clone(),
            ca_bundle: config.ca_bundle.clone(),
        }
    }

    /// The index as the installers' failure classification reads it (source builds are never
    /// part of an image build).
    pub(super) fn as_index_config(&self) -> IndexConfig {
        IndexConfig {
            index_url: self.index_url.clone(),
            extra_index_urls: self.extra_index_urls.clone(),
            ca_bundle_digest: None,
            allow_source_builds: false,
        }
    }

    /// pip's configuration file for the first stage; `bundle_at` is where the context puts the
    /// CA bundle, when there is one.
    pub(super) fn pip_conf(&self, bundle_at: Option<&str>) -> String {
        let mut conf = format!(
            "[global]\nindex-url = {}\ntimeout = {INDEX_TIMEOUT_SECS}\nretries = {INDEX_RETRIES}\n",
            self.index_url.as_deref().unwrap_or(PYPI)
        );
        if !self.extra_index_urls.is_empty() {
            conf.push_str(&format!(
                "extra-index-url = {}\n",
                self.extra_index_urls.join(" ")
            ));
        }
        // pip ignores a plain-http index unless its host is trusted: the operator chose it.
        let plain = crate::engine::deps::plain_http_hosts(&self.as_index_config());
        if !plain.is_empty() {
            conf.push_str(&format!("trusted-host = {}\n", plain.join(" ")));
        }
        if let Some(path) = bundle_at {
            conf.push_str(&format!("cert = {path}\n"));
        }
        conf
    }

    /// The CA bundle's bytes (empty without one).
    pub(super) fn bundle(&self) -> Result<Vec<u8>, ImageError> {
        match &self.ca_bundle {
            Some(path) => std::fs::read(path).map_err(ImageError::io(format!(
                "cannot read the CA bundle {}",
                path.display()
            ))),
            None => Ok(Vec::new()),
        }
    }
}

/// A fresh id for one build's first stage.
pub(super) fn build_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Removes the first stage's images of build `build_id` (they hold the index configuration and
/// the bundle); the engine drops their untagged parents with them.
pub(super) async fn remove_first_stage(docker: &Docker, build_id: &str) {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("{BUILD_LABEL}={build_id}")],
    )]);
    // A child goes before its parent: a few rounds remove a chain whatever the listing's order.
    for _ in 0..8 {
        let images = match docker
            .list_images(Some(ListImagesOptions {
                all: true,
                filters: Some(filters.clone()),
                ..Default::default()
            }))
            .await
        {
            Ok(images) => images,
            Err(e) => {
                tracing::warn!("cannot list the build's intermediate images: {e}");
                return;
            }
        };
        if images.is_empty() {
            return;
        }
        for image in images {
            let removed = docker
                .remove_image(
                    &image.id,
                    Some(RemoveImageOptions {
                        force: true,
                        ..Default::default()
                    }),
                    None,
                )
                .await;
            if let Err(e) = removed {
                tracing::debug!(image = image.id, "not removed yet: {e}");
            }
        }
    }
    tracing::warn!(
        "intermediate images labelled {BUILD_LABEL}={build_id} are left: remove them with \
         `docker image prune --filter label={BUILD_LABEL}={build_id}`"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_is_configured_from_the_settings() {
        let index = Index {
            index_url: Some("https://mirror/simple".into()),
            extra_index_urls: vec!["https://a/simple".into(), "https://b/simple".into()],
            ca_bundle: None,
        };
        assert_eq!(
            index.pip_conf(Some("/tmp/x/ca-bundle.crt")),
            "[global]\nindex-url = https://mirror/simple\ntimeout = 15\nretries = 1\n\
             extra-index-url = https://a/simple https://b/simple\n\
             cert = /tmp/x/ca-bundle.crt\n"
        );
        let plain = Index::default().pip_conf(None);
        assert!(
            plain.contains("index-url = https://pypi.org/simple\n"),
            "{plain}"
        );
        assert!(!plain.contains("cert"), "{plain}");
        assert!(!plain.contains("trusted-host"), "{plain}");
        let local = Index {
            index_url: Some("http://172.17.0.1:8000/simple/".into()),
            ..Index::default()
        };
        assert!(
            local
                .pip_conf(None)
                .contains("trusted-host = 172.17.0.1:8000\n"),
            "{}",
            local.pip_conf(None)
        );
    }
}
