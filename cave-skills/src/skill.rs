//! A skill: what SKILL.md says, where it lives, and what it gives the runtime.

use cave_core::Resources;
use serde_json::{Map, Value as Json};
use std::path::PathBuf;

/// An Agent Skill: instructions the agent loads when it needs them (progressive disclosure),
/// read from a SKILL.md or built in code.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Skill {
    /// Its name: lowercase letters, digits and single hyphens, at most 64 characters.
    pub name: String,
    /// What it is for and when to use it (at most 1024 characters): all the prompt shows.
    pub description: String,
    /// The instructions, returned by `activate_skill`.
    pub body: String,
    /// `license`, if the frontmatter has one.
    pub license: Option<String>,
    /// `compatibility`, if the frontmatter has one.
    pub compatibility: Option<String>,
    /// `metadata`, if the frontmatter has one.
    pub metadata: Option<Json>,
    /// `allowed-tools`, if the frontmatter has one.
    pub allowed_tools: Option<Json>,
    /// Frontmatter keys this crate does not know, kept as written.
    pub extra: Map<String, Json>,
    /// The directory it was read from (`None` for a skill built in code).
    pub dir: Option<PathBuf>,
    /// Its other files, by path relative to `dir`, sorted (SKILL.md itself excluded).
    pub files: Vec<String>,
    /// `injection.py` beside SKILL.md, if there is one.
    pub injection: Option<PathBuf>,
    /// Resources a skill built in code gives the runtime.
    pub resources: Resources,
}

impl Skill {
    /// A skill built in code. The name and description are checked by
    /// [`SkillSet::add`](crate::SkillSet::add), as a file's would be.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            body: body.into(),
            license: None,
            compatibility: None,
            metadata: None,
            allowed_tools: None,
            extra: Map::new(),
            dir: None,
            files: Vec::new(),
            injection: None,
            resources: Resources::new(),
        }
    }

    /// Gives the skill resources (functions, variables, types) for the runtime.
    pub fn with_resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Whether it gives the runtime anything (an `injection.py`, or resources).
    pub fn injects(&self) -> bool {
        self.injection.is_some() || !self.resources.is_empty()
    }
}
