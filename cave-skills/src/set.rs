//! The skills an agent has: their listing for the prompt, and the two functions the model
//! reads them with.

use crate::discover::{SkillError, name_problem};
use crate::{Discovery, Skill};
use cave_core::{
    AgentBuilder, Args, Function, HostError, Param, Resources, Runtime, RuntimeError, Signature,
    Value,
};
use std::path::{Component, Path};
use std::sync::Arc;

/// A runtime error, said to be about a skill's resources.
fn in_skill(skill: &str, error: RuntimeError) -> RuntimeError {
    RuntimeError::InvalidResource {
        name: format!("skill `{skill}`"),
        problem: error.to_string(),
    }
}

/// Resources as the prompt would show them, sections that have something only.
fn describe(resources: Resources) -> String {
    let mut registry = cave_core::Registry::new();
    if registry.claim(resources.with_hidden(false)).is_err() {
        return String::new();
    }
    let d = registry.describe();
    [
        ("functions", d.functions, "No functions available"),
        ("variables", d.variables, "No variables available"),
        ("types", d.types, "No types available"),
    ]
    .into_iter()
    .filter(|(_, text, empty)| text != empty)
    .map(|(tag, text, _)| format!("<{tag}>\n{text}\n</{tag}>"))
    .collect::<Vec<_>>()
    .join("\n")
}

/// The largest file `read_skill_file` returns.
const MAX_READ: u64 = 1 << 20;

/// Skills by name: the `<skills>` listing, `activate_skill` and `read_skill_file`.
#[derive(Clone, Debug, Default)]
pub struct SkillSet {
    skills: Vec<Skill>,
    /// What each skill put in the runtime (its `injection.py`, its resources), described for
    /// `activate_skill`: hidden from the prompt until then.
    injected: std::collections::HashMap<String, String>,
}

impl SkillSet {
    /// No skills.
    pub fn new() -> Self {
        Self::default()
    }

    /// The skills a discovery found, if it found no problem.
    pub fn from_discovery(discovery: Discovery) -> Result<Self, crate::SkillErrors> {
        if !discovery.errors.is_empty() {
            return Err(crate::SkillErrors(discovery.errors));
        }
        let mut set = Self::new();
        for skill in discovery.skills {
            set.add(skill).map_err(|e| crate::SkillErrors(vec![e]))?;
        }
        Ok(set)
    }

    /// Adds a skill, checked like a file's (name, description), refusing a second one of the
    /// same name.
    pub fn add(&mut self, skill: Skill) -> Result<&mut Self, SkillError> {
        let at = skill
            .dir
            .clone()
            .unwrap_or_else(|| format!("skill `{}`", skill.name).into());
        let error = |field: &str, message: String| SkillError {
            path: at.clone(),
            field: Some(field.to_owned()),
            message,
        };
        if let Some(problem) = name_problem(&skill.name) {
            return Err(error("name", problem));
        }
        if skill.description.trim().is_empty() {
            return Err(error(
                "description",
                "field `description` is empty".to_owned(),
            ));
        }
        if self.skills.iter().any(|s| s.name == skill.name) {
            return Err(error(
                "name",
                format!("a skill named `{}` is already there", skill.name),
            ));
        }
        self.skills.push(skill);
        Ok(self)
    }

    /// The skills, in the order they were added.
    pub fn skills(&self) -> &[Skill] {
        &self.skills
    }

    /// Returns true if and only if there are none.
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// The `<skills>` section of the prompt: `- name: description` per skill.
    pub fn listing(&self) -> String {
        self.skills
            .iter()
            .map(|s| format!("- {}: {}", s.name, s.description.trim()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn get(&self, name: &str) -> Result<&Skill, HostError> {
        self.skills.iter().find(|s| s.name == name).ok_or_else(|| {
            let available: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
            HostError::new(
                "KeyError",
                format!("Skill '{name}' not found. Available skills: {available:?}"),
            )
        })
    }

    /// What `activate_skill(name)` returns: the instructions, then the skill's other files.
    pub fn activate(&self, name: &str) -> Result<String, HostError> {
        let skill = self.get(name)?;
        let mut text = skill.body.clone();
        if let Some(injected) = self.injected.get(name) {
            text.push_str("\n\nThis skill put these in your Python session; use them:\n");
            text.push_str(injected);
        }
        if !skill.files.is_empty() {
            text.push_str(&format!(
                "\n\nFiles of this skill (read one with read_skill_file({:?}, path)):",
                skill.name
            ));
            for file in &skill.files {
                text.push_str("\n- ");
                text.push_str(file);
            }
        }
        Ok(text)
    }

    /// What `read_skill_file(name, path)` returns: a file of the skill, as text. Paths are
    /// relative to the skill's directory and may not leave it (`..`, absolute paths, symlinks
    /// pointing out are refused).
    pub fn read_file(&self, name: &str, path: &str) -> Result<String, HostError> {
        let skill = self.get(name)?;
        let refuse = |why: &str| HostError::new("PermissionError", format!("{path:?}: {why}"));
        let Some(dir) = &skill.dir else {
            return Err(HostError::new(
                "FileNotFoundError",
                format!("skill `{name}` has no files"),
            ));
        };
        let relative = Path::new(path);
        if path.is_empty() || relative.is_absolute() {
            return Err(refuse(
                "give a path relative to the skill's directory, as activate_skill lists them",
            ));
        }
        if relative
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(refuse(
                "a skill's files are inside its directory: `..` is not allowed",
            ));
        }
        let base = dir.canonicalize().map_err(|e| {
            HostError::new("FileNotFoundError", format!("the skill's directory: {e}"))
        })?;
        let full = base.join(relative).canonicalize().map_err(|_| {
            HostError::new(
                "FileNotFoundError",
                format!(
                    "{path:?} is not a file of skill `{name}`; its files: {:?}",
                    skill.files
                ),
            )
        })?;
        if !full.starts_with(&base) {
            return Err(refuse("it leads outside the skill's directory"));
        }
        let meta =
            std::fs::metadata(&full).map_err(|e| HostError::new("OSError", e.to_string()))?;
        if !meta.is_file() {
            return Err(HostError::new(
                "IsADirectoryError",
                format!("{path:?} is not a file"),
            ));
        }
        if meta.len() > MAX_READ {
            return Err(HostError::new(
                "ValueError",
                format!(
                    "{path:?} has {} bytes; read_skill_file returns files up to {MAX_READ} bytes",
                    meta.len()
                ),
            ));
        }
        let bytes = std::fs::read(&full).map_err(|e| HostError::new("OSError", e.to_string()))?;
        String::from_utf8(bytes).map_err(|_| {
            HostError::new("UnicodeDecodeError", format!("{path:?} is not UTF-8 text"))
        })
    }

    /// Gives an agent these skills: registers `activate_skill` and `read_skill_file` with its
    /// runtime (all or nothing) and puts the listing in its system prompt. No skills: nothing
    /// is registered and the prompt says there are none.
    ///
    /// What a skill gives the runtime (its `injection.py`, run in the runtime's Python, and the
    /// resources of a skill built in code) is registered first, hidden from the prompt: the
    /// model sees it described when it activates the skill. It survives `reset` (and, on the
    /// kernel runtime, a new process). Each skill's batch is all or nothing; a failure (a name
    /// taken, a broken `injection.py` with its Python error) ends the install with an error
    /// naming the skill, and the agent should not be built.
    pub async fn install(
        &self,
        runtime: &dyn Runtime,
        builder: &mut AgentBuilder,
    ) -> Result<(), RuntimeError> {
        self.install_with(runtime, builder, |batch| batch).await
    }

    /// [`install`](Self::install), each batch passed through `wrap` before it is registered:
    /// how the host guards or audits the skills' host calls (see
    /// [`Resources::map`](cave_core::Resources::map)).
    pub async fn install_with(
        &self,
        runtime: &dyn Runtime,
        builder: &mut AgentBuilder,
        wrap: impl Fn(Resources) -> Resources,
    ) -> Result<(), RuntimeError> {
        if let Some(listing) = self.install_into(runtime, wrap).await? {
            builder.skills(listing);
        }
        Ok(())
    }

    /// What [`install_with`](Self::install_with) does to the runtime, for a host without an
    /// agent (a session served over MCP): returns the listing to show whoever writes the
    /// code, or `None` when there are no skills (and nothing was registered).
    pub async fn install_into(
        &self,
        runtime: &dyn Runtime,
        wrap: impl Fn(Resources) -> Resources,
    ) -> Result<Option<String>, RuntimeError> {
        if self.is_empty() {
            return Ok(None);
        }
        let mut set = self.clone();
        for skill in &self.skills {
            let mut given = Vec::new();
            if let Some(path) = &skill.injection {
                let registered = runtime
                    .register_python_file(path, true)
                    .await
                    .map_err(|e| in_skill(&skill.name, e))?;
                given.extend(registered.into_items());
            }
            if !skill.resources.is_empty() {
                runtime
                    .register(wrap(skill.resources.clone().with_hidden(true)))
                    .await
                    .map_err(|e| in_skill(&skill.name, e))?;
                given.extend(skill.resources.items().iter().cloned());
            }
            if !given.is_empty() {
                set.injected
                    .insert(skill.name.clone(), describe(given.into_iter().collect()));
            }
        }
        runtime.register(wrap(set.resources())).await?;
        Ok(Some(set.listing()))
    }

    /// `activate_skill` and `read_skill_file`, as host functions for the runtime.
    pub fn resources(&self) -> Resources {
        let set = Arc::new(self.clone());
        let activate = {
            let set = set.clone();
            Function::host(
                "activate_skill",
                Signature::new([Param::new("name").annotated("str")]).returns("str"),
                move |args: Args| {
                    let set = set.clone();
                    async move {
                        let name: String = args.get("name")?;
                        set.activate(&name).map(Value::Str)
                    }
                },
            )
            .with_doc("Load a skill's instructions by its name (from <skills>) before using it. Returns the instructions and the list of the skill's other files.")
        };
        let read = Function::host(
            "read_skill_file",
            Signature::new([
                Param::new("name").annotated("str"),
                Param::new("path").annotated("str"),
            ])
            .returns("str"),
            move |args: Args| {
                let set = set.clone();
                async move {
                    let name: String = args.get("name")?;
                    let path: String = args.get("path")?;
                    set.read_file(&name, &path).map(Value::Str)
                }
            },
        )
        .with_doc("Read one of a skill's files (a path activate_skill listed), as text.");
        Resources::new().function(activate).function(read)
    }
}
