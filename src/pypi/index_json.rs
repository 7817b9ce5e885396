//! Streaming the PEP 691 JSON index: the names of its `projects`, without holding the document.

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::index_file::NameSink;

/// The top-level PEP 691 object: streams its `projects` into the sink, skips everything else.
pub(super) struct IndexDocument<'a, 'b>(pub(super) &'a mut NameSink<'b>);

impl<'de> DeserializeSeed<'de> for IndexDocument<'_, '_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexDocument<'_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a PEP 691 project list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let sink = self.0;
        let mut saw_projects = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "projects" {
                map.next_value_seed(ProjectList(&mut *sink))?;
                saw_projects = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(saw_projects)
    }
}

/// The `projects` array, one `{"name": ...}` at a time.
struct ProjectList<'a, 'b>(&'a mut NameSink<'b>);

#[derive(Deserialize)]
struct ProjectEntry {
    name: String,
}

impl<'de> DeserializeSeed<'de> for ProjectList<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ProjectList<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of projects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(entry) = seq.next_element::<ProjectEntry>()? {
            self.0.push(&entry.name).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}
