//! The tools, one file per group. Each handler declares its name, annotations, output schema and
//! description (with `{placeholders}` for the live configuration, see [`super::descriptions`]) in
//! its `#[tool]` attribute, translates its parameters to one engine call and `?`s the outcome
//! into a [`super::outcome::ToolError`].

mod files;
mod notebook;
mod run;
mod search;
mod session;
mod snapshot;

#[cfg(test)]
mod tests;
