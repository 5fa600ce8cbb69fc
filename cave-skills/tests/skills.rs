//! Reading, checking and using skills.

use cave_skills::{Skill, SkillSet, discover};
use cave_testing::TestDir;
use std::path::Path;

/// A fresh directory for one test, removed when it ends.
fn dir(test: &str) -> TestDir {
    TestDir::new(&format!("skills-{test}"))
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn skill_md(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nInstructions of {name}.\n")
}

#[test]
fn every_problem_is_one_line_naming_the_file_and_the_field() {
    let root = dir("messages");
    let cases: [(&str, &str, Option<&str>, &str); 11] = [
        ("no-frontmatter", "just text\n", None, "no frontmatter"),
        (
            "bad-yaml",
            "---\nname: [unclosed\n---\n",
            None,
            "not valid YAML",
        ),
        (
            "not-mapping",
            "---\n- a\n- b\n---\n",
            None,
            "must be a mapping",
        ),
        (
            "no-name",
            "---\ndescription: d\n---\n",
            Some("name"),
            "field `name` is missing",
        ),
        (
            "name-number",
            "---\nname: 12\ndescription: d\n---\n",
            Some("name"),
            "field `name` must be text, not a number",
        ),
        (
            "bad-shape",
            "---\nname: Bad--Name\ndescription: d\n---\n",
            Some("name"),
            "lowercase letters, digits and single hyphens",
        ),
        (
            "too-long",
            &format!("---\nname: {}\ndescription: d\n---\n", "a".repeat(65)),
            Some("name"),
            "65 characters; at most 64",
        ),
        (
            "no-description",
            "---\nname: no-description\n---\n",
            Some("description"),
            "field `description` is missing",
        ),
        (
            "empty-description",
            "---\nname: empty-description\ndescription: \"  \"\n---\n",
            Some("description"),
            "is empty",
        ),
        (
            "long-description",
            &format!(
                "---\nname: long-description\ndescription: {}\n---\n",
                "x".repeat(1025)
            ),
            Some("description"),
            "1025 characters; at most 1024",
        ),
        (
            "bad-license",
            "---\nname: bad-license\ndescription: d\nlicense: [1]\n---\n",
            Some("license"),
            "field `license` must be text, not a list",
        ),
    ];
    for (name, text, _, _) in &cases {
        write(&root.join(name).join("SKILL.md"), text);
    }
    let found = discover(&root);
    assert!(found.skills.is_empty(), "{:?}", found.skills);
    for (name, _, field, message) in cases {
        let file = root.join(name).join("SKILL.md");
        let error = found
            .errors
            .iter()
            .find(|e| e.path == file)
            .unwrap_or_else(|| panic!("no error for {name}: {:?}", found.errors));
        assert_eq!(error.field.as_deref(), field, "{name}");
        let line = error.to_string();
        assert!(line.contains(message), "{name}: {line}");
        assert!(line.starts_with(&file.display().to_string()), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}

#[test]
fn the_three_shapes_of_a_path() {
    let root = dir("shapes");
    write(&root.join("alpha/SKILL.md"), &skill_md("alpha", "First."));
    write(
        &root.join("beta-dir/SKILL.md"),
        &skill_md("beta", "Second."),
    );
    write(&root.join("not-a-skill/notes.txt"), "x");
    // A directory of skill directories.
    let found = discover(&root);
    assert!(found.is_valid(), "{:?}", found.errors);
    let names: Vec<&str> = found.skills.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(found.warnings.len(), 1, "{:?}", found.warnings);
    assert!(
        found.warnings[0].contains("the directory is named `beta-dir` but the skill is `beta`")
    );
    // A directory holding one, and the file itself.
    assert_eq!(discover(root.join("alpha")).skills[0].name, "alpha");
    assert_eq!(
        discover(root.join("alpha/SKILL.md")).skills[0].name,
        "alpha"
    );
    // Nothing there.
    let empty = dir("shapes-empty");
    let found = discover(&empty);
    assert!(
        found.errors[0].to_string().contains("no SKILL.md here"),
        "{:?}",
        found.errors
    );
    assert!(
        discover(empty.join("missing")).errors[0]
            .to_string()
            .contains("cannot read it")
    );
    // Unknown keys are kept; optional ones exposed.
    write(
        &root.join("gamma/SKILL.md"),
        "---\nname: gamma\ndescription: Third.\nlicense: MIT\nallowed-tools: [python]\nmetadata:\n  version: 2\nowner: team-a\n---\nBody.\n",
    );
    let gamma = discover(root.join("gamma")).skills.remove(0);
    assert_eq!(gamma.license.as_deref(), Some("MIT"));
    assert_eq!(gamma.allowed_tools, Some(serde_json::json!(["python"])));
    assert_eq!(gamma.metadata, Some(serde_json::json!({"version": 2})));
    assert_eq!(gamma.extra.get("owner"), Some(&serde_json::json!("team-a")));
    assert_eq!(gamma.body, "Body.");
}

#[test]
fn two_skills_with_one_name_are_an_error_naming_both() {
    let root = dir("duplicates");
    write(&root.join("one/SKILL.md"), &skill_md("same", "A."));
    write(&root.join("two/SKILL.md"), &skill_md("same", "B."));
    let found = discover(&root);
    assert_eq!(found.errors.len(), 1, "{:?}", found.errors);
    let line = found.errors[0].to_string();
    assert!(
        line.contains("two/SKILL.md")
            && line.contains("one/SKILL.md")
            && line.contains("defined twice"),
        "{line}"
    );
}

#[test]
fn activation_gives_the_body_and_the_files() {
    let root = dir("activation");
    write(
        &root.join("pdf/SKILL.md"),
        &skill_md("pdf", "Fill PDF forms."),
    );
    write(&root.join("pdf/scripts/fill.py"), "print('fill')");
    write(&root.join("pdf/references/forms.md"), "# Forms");
    write(&root.join("pdf/injection.py"), "__exports__ = []");
    write(&root.join("pdf/.hidden"), "x");
    let skills = SkillSet::from_discovery(discover(&root)).unwrap();
    let skill = &skills.skills()[0];
    assert_eq!(skill.files, ["references/forms.md", "scripts/fill.py"]);
    assert!(skill.injects());
    let text = skills.activate("pdf").unwrap();
    assert_eq!(
        text,
        "Instructions of pdf.\n\nFiles of this skill (read one with read_skill_file(\"pdf\", path)):\n- references/forms.md\n- scripts/fill.py"
    );
    let err = skills.activate("docx").unwrap_err();
    assert_eq!(err.python_type, "KeyError");
    assert_eq!(
        err.message,
        "Skill 'docx' not found. Available skills: [\"pdf\"]"
    );
    assert_eq!(skills.listing(), "- pdf: Fill PDF forms.");
}

#[test]
fn reading_files_never_leaves_the_skill() {
    let root = dir("reading");
    write(
        &root.join("pdf/SKILL.md"),
        &skill_md("pdf", "Fill PDF forms."),
    );
    write(&root.join("pdf/references/forms.md"), "# Forms");
    write(&root.join("secret.txt"), "do not read");
    std::os::unix::fs::symlink(root.join("secret.txt"), root.join("pdf/references/link.md"))
        .unwrap();
    let skills = SkillSet::from_discovery(discover(root.join("pdf"))).unwrap();
    assert_eq!(
        skills.read_file("pdf", "references/forms.md").unwrap(),
        "# Forms"
    );
    assert_eq!(
        skills.read_file("pdf", "./references/forms.md").unwrap(),
        "# Forms"
    );
    for path in [
        "../secret.txt",
        "references/../../secret.txt",
        &root.join("secret.txt").display().to_string(),
        "references/link.md",
    ] {
        let err = skills.read_file("pdf", path).unwrap_err();
        assert_eq!(err.python_type, "PermissionError", "{path}: {err:?}");
        assert!(!err.message.contains("do not read"));
    }
    let err = skills.read_file("pdf", "references/none.md").unwrap_err();
    assert_eq!(err.python_type, "FileNotFoundError");
    assert!(
        err.message.contains("references/forms.md"),
        "lists the files: {}",
        err.message
    );
}

#[test]
fn skills_built_in_code_are_checked_like_files() {
    let mut skills = SkillSet::new();
    skills
        .add(Skill::new(
            "convert",
            "Convert units.",
            "Use 2.54 cm per inch.",
        ))
        .unwrap();
    assert_eq!(skills.activate("convert").unwrap(), "Use 2.54 cm per inch.");
    assert!(
        skills
            .add(Skill::new("convert", "Again.", ""))
            .unwrap_err()
            .message
            .contains("already there")
    );
    assert!(
        skills
            .add(Skill::new("Bad Name", "x", ""))
            .unwrap_err()
            .message
            .contains("lowercase")
    );
    assert!(
        skills
            .add(Skill::new("blank", " ", ""))
            .unwrap_err()
            .message
            .contains("empty")
    );
    let err = skills.read_file("convert", "x.md").unwrap_err();
    assert_eq!(err.python_type, "FileNotFoundError");
}
