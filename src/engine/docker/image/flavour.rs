//! Image flavours: the sandbox image with a pinned set of packages baked in, so code imports them
//! without `dependencies` and without any install (the network stays off).
//!
//! A flavour is one entry of [`FLAVOURS`]: its name, the packages people import with exact
//! versions, the packages those depend on (pinned too, so a build installs exactly this set) and
//! the modules a build imports to check itself. One recipe ([`RECIPE`]) builds any flavour `FROM`
//! the sandbox image ([`DEFAULT_IMAGE`], built first when missing), in two stages: the first
//! installs the set with pip under a staging root (a failure explained from pip's own lines as the
//! installers' are: [`ImageError::Index`]), through
//! the configured index (`PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`) and CA bundle
//! (`SANDBOX_CA_BUNDLE`); the second copies only the installed files, compiles their bytecode
//! and builds matplotlib's font cache, with a start-up hook that copies it into the sandbox's
//! `MPLCONFIGDIR` (on its empty `/tmp`). The index configuration and the bundle never reach the
//! image or its history: the first stage's images are removed after the build.

use std::collections::HashMap;

use bollard::query_parameters::BuildImageOptions;
use bollard::Docker;

use super::fetch::{self, Index};
use super::{BuildMode, ImageError, RECIPE_LABEL};
use crate::config::DEFAULT_IMAGE;
use crate::engine::progress::ProgressSink;

/// The recipe of every flavour (a two-stage Dockerfile).
pub const RECIPE: &str = include_str!("Dockerfile.flavour");
/// The build's steps inside the image (probe, fetch, prepare).
const BUILD_SCRIPT: &str = include_str!("flavour_build.py");
/// The start-up hook that seeds matplotlib's font cache.
const STARTUP_HOOK: &str = include_str!("flavour_startup.py");
/// Label naming the flavour an image is.
pub const FLAVOUR_LABEL: &str = "io.python-code-sandbox.flavour";
/// Label listing the pinned packages people import (`name==version`, space-separated).
pub const PACKAGES_LABEL: &str = "io.python-code-sandbox.flavour.packages";

/// A pinned set of packages baked into a derived sandbox image.
#[derive(Debug, PartialEq, Eq)]
pub struct Flavour {
    /// Its name on the command line (`--flavour NAME`) and in the default tag.
    pub name: &'static str,
    /// One line for `--help`.
    pub summary: &'static str,
    /// The packages people import, with exact versions.
    pub packages: &'static [(&'static str, &'static str)],
    /// What those depend on, with exact versions: the whole set is pinned.
    pub dependencies: &'static [(&'static str, &'static str)],
    /// Modules the build imports to check the set.
    pub imports: &'static [&'static str],
}

/// Every flavour. Versions: wheels for CPython 3.11 on manylinux x86_64, resolved
/// together by pip.
pub const FLAVOURS: &[Flavour] = &[Flavour {
    name: "datascience",
    summary: "numpy, pandas, matplotlib, scipy, scikit-learn and pillow",
    packages: &[
        ("numpy", "2.4.6"),
        ("pandas", "3.1.1"),
        ("matplotlib", "3.11.2"),
        ("scipy", "1.17.1"),
        ("scikit-learn", "1.9.1"),
        ("pillow", "13.0.0"),
    ],
    dependencies: &[
        ("cloudpickle", "3.1.3"),
        ("contourpy", "1.3.3"),
        ("cycler", "0.12.1"),
        ("fonttools", "4.68.0"),
        ("joblib", "1.6.0"),
        ("kiwisolver", "1.5.1"),
        ("narwhals", "2.29.0"),
        ("packaging", "26.4"),
        ("pyparsing", "3.3.3"),
        ("python-dateutil", "4.0.0"),
        ("threadpoolctl", "3.8.0"),
        ("tzdata", "2026.6"),
    ],
    imports: &[
        "numpy",
        "pandas",
        "matplotlib.pyplot",
        "scipy.stats",
        "sklearn.linear_model",
        "PIL.Image",
    ],
}];

/// The flavour called `name`.
pub fn find(name: &str) -> Option<&'static Flavour> {
    FLAVOURS.iter().find(|f| f.name == name)
}

/// The flavour whose default tag is `tag`.
pub fn for_tag(tag: &str) -> Option<&'static Flavour> {
    FLAVOURS.iter().find(|f| f.default_tag() == tag)
}

impl Flavour {
    /// `python-code-sandbox:py3.11-NAME`.
    pub fn default_tag(&self) -> String {
        format!("{DEFAULT_IMAGE}-{}", self.name)
    }

    /// The packages people import, as `name==version` separated by spaces.
    pub fn pinned(&self) -> String {
        self.packages
            .iter()
            .map(|(name, version)| format!("{name}=={version}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// What the build reads: the whole pinned set (the requested packages first) and the imports.
    fn manifest(&self) -> String {
        serde_json::json!({
            "name": self.name,
            "packages": self.packages.iter().chain(self.dependencies).collect::<Vec<_>>(),
            "imports": self.imports,
        })
        .to_string()
    }

    /// A hash of everything the image is made of: the recipe, its scripts, the set and the base
    /// image's recipe.
    pub fn recipe_hash(&self) -> String {
        fnv1a(
            [
                RECIPE,
                BUILD_SCRIPT,
                STARTUP_HOOK,
                &self.manifest(),
                &super::recipe_hash(),
            ]
            .iter()
            .flat_map(|part| part.bytes().chain([0])),
        )
    }

    /// The labels of the flavour's image.
    pub fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (RECIPE_LABEL.to_string(), self.recipe_hash()),
            (FLAVOUR_LABEL.to_string(), self.name.to_string()),
            (PACKAGES_LABEL.to_string(), self.pinned()),
        ])
    }
}

fn fnv1a(bytes: impl Iterator<Item = u8>) -> String {
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016x}")
}

/// Builds `flavour` as `tag` from the sandbox image, telling `progress` each step. The sandbox
/// image is built first when it is missing (`mode` says how).
pub async fn build(
    docker: &Docker,
    flavour: &Flavour,
    tag: &str,
    mode: BuildMode,
    index: &Index,
    progress: &ProgressSink,
) -> Result<(), ImageError> {
    let base = DEFAULT_IMAGE;
    match docker.inspect_image(base).await {
        Ok(image) => {
            let current = image
                .config
                .and_then(|c| c.labels)
                .and_then(|labels| labels.get(RECIPE_LABEL).cloned())
                .is_some_and(|hash| hash == super::recipe_hash());
            progress(&format!(
                "from the sandbox image {base}{}",
                if current {
                    ""
                } else {
                    " (made by an older recipe: `image build` renews it)"
                }
            ));
        }
        Err(_) => {
            progress(&format!(
                "the sandbox image {base} is missing: building it first"
            ));
            super::build(docker, base, mode, index, progress).await?;
        }
    }
    progress(&format!(
        "flavour {}: {} ({} packages pinned in all)",
        flavour.name,
        flavour.pinned(),
        flavour.packages.len() + flavour.dependencies.len()
    ));
    let bundle = index.bundle()?;
    let manifest = flavour.manifest();
    let pip_conf = index.pip_conf((!bundle.is_empty()).then_some("/tmp/pcs-flavour/ca-bundle.crt"));
    let context = super::pack_context(&[
        ("Dockerfile", RECIPE.as_bytes()),
        ("fetch/flavour_build.py", BUILD_SCRIPT.as_bytes()),
        ("fetch/flavour.json", manifest.as_bytes()),
        ("fetch/pip.conf", pip_conf.as_bytes()),
        ("fetch/ca-bundle.crt", bundle.as_slice()),
        ("keep/flavour_build.py", BUILD_SCRIPT.as_bytes()),
        ("keep/flavour_startup.py", STARTUP_HOOK.as_bytes()),
        ("keep/flavour.json", manifest.as_bytes()),
    ])?;
    let build_id = fetch::build_id();
    let options = BuildImageOptions {
        t: Some(tag.to_string()),
        dockerfile: "Dockerfile".to_string(),
        rm: true,
        forcerm: true,
        buildargs: Some(HashMap::from([
            ("BASE".to_string(), base.to_string()),
            ("BUILD_ID".to_string(), build_id.clone()),
        ])),
        labels: Some(flavour.labels()),
        ..Default::default()
    };
    progress(&format!("building {tag}"));
    let stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    let built = super::follow_build(stream, progress).await;
    fetch::remove_first_stage(docker, &build_id).await;
    match built {
        Ok(()) => Ok(()),
        Err(super::BuildFailure {
            error,
            marked,
            step_output,
        }) => Err(match marked {
            // pip could not install the set: why, in the installers' words.
            Some(line) if line == "pip" || line.starts_with("pip ") => {
                super::index_failure(index, "the flavour's packages", &step_output)
            }
            Some(line) => ImageError::Refused {
                what: "the flavour's build failed",
                message: line,
            },
            None => error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flavour_is_pinned_exactly_and_named_once() {
        for flavour in FLAVOURS {
            assert_eq!(find(flavour.name), Some(flavour));
            assert_eq!(for_tag(&flavour.default_tag()), Some(flavour));
            let all: Vec<_> = flavour
                .packages
                .iter()
                .chain(flavour.dependencies)
                .collect();
            for (name, version) in &all {
                assert!(
                    !version.is_empty()
                        && version
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '.'),
                    "{name} {version}"
                );
            }
            let mut names: Vec<_> = all.iter().map(|(n, _)| n.to_ascii_lowercase()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), all.len(), "a package listed twice");
        }
        assert_eq!(
            find("datascience").map(Flavour::default_tag),
            Some("python-code-sandbox:py3.11-datascience".to_string())
        );
        assert_eq!(find("nope"), None);
    }

    #[test]
    fn the_hash_changes_with_the_set() {
        let flavour = &FLAVOURS[0];
        let other = Flavour {
            packages: &[("numpy", "1.0")],
            ..Flavour { ..*flavour }
        };
        assert_ne!(flavour.recipe_hash(), other.recipe_hash());
        assert_eq!(flavour.labels()[FLAVOUR_LABEL], "datascience");
        assert!(flavour.labels()[PACKAGES_LABEL].starts_with("numpy==2.4.6 pandas=="));
    }

    #[test]
    fn a_missing_flavour_is_built_not_pulled() {
        let hint = super::super::missing_hint("python-code-sandbox:py3.11-datascience");
        assert!(hint.contains("image build --flavour datascience"), "{hint}");
    }
}
