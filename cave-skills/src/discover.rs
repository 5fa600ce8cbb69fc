//! Reading SKILL.md files: the frontmatter (split here, parsed as YAML), its checks, and the
//! three shapes a path may have.

use crate::Skill;
use serde_json::{Map, Value as Json};
use std::fmt;
use std::path::{Path, PathBuf};

/// The file a skill is read from.
pub const SKILL_FILE: &str = "SKILL.md";
/// The optional Python module beside it.
pub const INJECTION_FILE: &str = "injection.py";
const MAX_NAME: usize = 64;
const MAX_DESCRIPTION: usize = 1024;
/// A skill's listing stops here: a skill is instructions and a few files, not a repository.
const MAX_FILES: usize = 1000;
const MAX_DEPTH: usize = 8;

/// One problem with one skill file, as one line: the file, the field, what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", path.display())]
#[non_exhaustive]
pub struct SkillError {
    /// The file (or directory) concerned.
    pub path: PathBuf,
    /// The frontmatter field concerned, if one is.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl SkillError {
    fn new(path: &Path, field: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

/// Skills found under a path, or every problem found there.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Discovery {
    /// The valid skills, in path order.
    pub skills: Vec<Skill>,
    /// Things worth knowing that do not stop a skill from working (a directory named
    /// differently from its skill).
    pub warnings: Vec<String>,
    /// Every problem, one line each.
    pub errors: Vec<SkillError>,
}

impl Discovery {
    /// Returns true if and only if nothing was wrong.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// All the problems of a discovery, when it had any.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct SkillErrors(pub Vec<SkillError>);

impl fmt::Display for SkillErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Reads the skills at `path`: a SKILL.md file, a directory holding one, or a directory of
/// skill directories (one level down). Every file is checked; nothing stops at the first
/// problem.
pub fn discover(path: impl AsRef<Path>) -> Discovery {
    let path = path.as_ref();
    let mut found = Discovery::default();
    let files = match skill_files(path) {
        Ok(files) => files,
        Err(e) => {
            found.errors.push(e);
            return found;
        }
    };
    for file in files {
        match read_skill(&file) {
            Ok((skill, warning)) => {
                found.warnings.extend(warning);
                found.skills.push(skill);
            }
            Err(errors) => found.errors.extend(errors),
        }
    }
    // One name, one skill.
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    for skill in &found.skills {
        let file = skill
            .dir
            .as_ref()
            .map(|d| d.join(SKILL_FILE))
            .unwrap_or_default();
        if let Some((_, first)) = seen.iter().find(|(n, _)| *n == skill.name) {
            found.errors.push(SkillError::new(
                &file,
                Some("name"),
                format!(
                    "skill `{}` is defined twice: here and in {}; rename one",
                    skill.name,
                    first.display()
                ),
            ));
        } else {
            seen.push((skill.name.clone(), file));
        }
    }
    found
}

/// The SKILL.md files a path stands for.
fn skill_files(path: &Path) -> Result<Vec<PathBuf>, SkillError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        SkillError::new(
            path,
            None,
            format!("cannot read it ({e}); give a SKILL.md file or a directory of skills"),
        )
    })?;
    if meta.is_file() {
        return Ok(vec![path.to_owned()]);
    }
    let own = path.join(SKILL_FILE);
    if own.is_file() {
        return Ok(vec![own]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| SkillError::new(path, None, format!("cannot list the directory ({e})")))?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join(SKILL_FILE))
        .filter(|file| file.is_file())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(SkillError::new(
            path,
            None,
            format!("no {SKILL_FILE} here nor in its subdirectories (one level down)"),
        ));
    }
    Ok(files)
}

/// The frontmatter's text and the body, split at the `---` lines.
fn split(text: &str) -> Option<(&str, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let start = first.len();
    let mut at = start;
    for line in lines {
        if line.trim_end() == "---" {
            return Some((&text[start..at], &text[at + line.len()..]));
        }
        at += line.len();
    }
    None
}

/// Reads and checks one SKILL.md: the skill and a warning, or every problem.
pub(crate) fn read_skill(file: &Path) -> Result<(Skill, Option<String>), Vec<SkillError>> {
    let fail = |field: Option<&str>, message: String| vec![SkillError::new(file, field, message)];
    let text =
        std::fs::read_to_string(file).map_err(|e| fail(None, format!("cannot read it ({e})")))?;
    let Some((yaml, body)) = split(&text) else {
        return Err(fail(
            None,
            "no frontmatter: SKILL.md starts with a `---` line, the fields (name, description), and another `---` line".to_owned(),
        ));
    };
    let fields: Json = serde_saphyr::from_str(yaml).map_err(|e| {
        fail(
            None,
            format!(
                "the frontmatter is not valid YAML: {}",
                cave_core::one_line(&e.to_string(), usize::MAX)
            ),
        )
    })?;
    let Json::Object(mut fields) = fields else {
        return Err(fail(
            None,
            "the frontmatter must be a mapping of fields (`name: ...`)".to_owned(),
        ));
    };
    let mut errors = Vec::new();
    let name = text_field(&mut fields, "name", file, &mut errors);
    if let Some(problem) = name.as_deref().and_then(name_problem) {
        errors.push(SkillError::new(file, Some("name"), problem));
    }
    let description = text_field(&mut fields, "description", file, &mut errors);
    if let Some(d) = &description {
        if d.trim().is_empty() {
            errors.push(SkillError::new(
                file,
                Some("description"),
                "field `description` is empty: say what the skill does and when to use it",
            ));
        } else if d.chars().count() > MAX_DESCRIPTION {
            errors.push(SkillError::new(
                file,
                Some("description"),
                format!(
                    "field `description` has {} characters; at most {MAX_DESCRIPTION}",
                    d.chars().count()
                ),
            ));
        }
    }
    let license = optional_text(&mut fields, "license", file, &mut errors);
    let compatibility = optional_text(&mut fields, "compatibility", file, &mut errors);
    let metadata = fields.remove("metadata");
    let allowed_tools = fields.remove("allowed-tools");
    let (Some(name), Some(description)) = (name, description) else {
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let dir = file.parent().unwrap_or(Path::new(".")).to_owned();
    let warning = dir
        .file_name()
        .and_then(|d| d.to_str())
        .filter(|d| *d != name)
        .map(|d| {
            format!(
                "{}: the directory is named `{d}` but the skill is `{name}`",
                file.display()
            )
        });
    let injection = dir.join(INJECTION_FILE);
    let mut skill = Skill::new(name, description, body.trim());
    skill.license = license;
    skill.compatibility = compatibility;
    skill.metadata = metadata;
    skill.allowed_tools = allowed_tools;
    skill.extra = fields;
    skill.files = list_files(&dir);
    skill.injection = injection.is_file().then_some(injection);
    skill.dir = Some(dir);
    Ok((skill, warning))
}

/// Why a name is not a skill name, if it is not.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("field `name` is empty".to_owned());
    }
    if name.chars().count() > MAX_NAME {
        return Some(format!(
            "field `name` has {} characters; at most {MAX_NAME}",
            name.chars().count()
        ));
    }
    let shape_ok = name.split('-').all(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    });
    (!shape_ok).then(|| format!(
        "field `name` is `{name}`: use lowercase letters, digits and single hyphens, not at either end (e.g. `pdf-forms`)"
    ))
}

fn text_field(
    fields: &mut Map<String, Json>,
    key: &str,
    file: &Path,
    errors: &mut Vec<SkillError>,
) -> Option<String> {
    if matches!(fields.get(key), None | Some(Json::Null)) {
        errors.push(SkillError::new(
            file,
            Some(key),
            format!("field `{key}` is missing"),
        ));
        return None;
    }
    optional_text(fields, key, file, errors)
}

fn optional_text(
    fields: &mut Map<String, Json>,
    key: &str,
    file: &Path,
    errors: &mut Vec<SkillError>,
) -> Option<String> {
    match fields.remove(key) {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(s),
        Some(other) => {
            errors.push(SkillError::new(
                file,
                Some(key),
                format!("field `{key}` must be text, not {}", kind(&other)),
            ));
            None
        }
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "empty",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "text",
        Json::Array(_) => "a list",
        Json::Object(_) => "a mapping",
    }
}

/// The skill's other files, relative to its directory: regular files only (no symlinks, no
/// hidden or cache files), sorted, bounded.
fn list_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_owned(), 0usize)];
    while let Some((at, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || name == "__pycache__" {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < MAX_DEPTH {
                pending.push((path, depth + 1));
            } else if kind.is_file() {
                let Ok(relative) = path.strip_prefix(dir) else {
                    continue;
                };
                let relative = relative.to_string_lossy().into_owned();
                if relative != SKILL_FILE && relative != INJECTION_FILE {
                    files.push(relative);
                }
            }
            if files.len() >= MAX_FILES {
                break;
            }
        }
    }
    files.sort();
    files
}
