//! A tidy check: no import circle between the modules of a crate.
//!
//! Each crate's top-level modules (`src/x.rs` or `src/x/`), and the submodules of each
//! directory module, form a graph whose edges are the paths a module names: `crate::y` for the
//! top level, `super::y` between the submodules of one directory. A circle means two modules
//! that cannot be read (or moved) apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules and the modules each names, within one scope (a crate's top level, or one directory
/// module's submodules).
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The modules directly in `dir`: `x.rs` files (but `lib.rs`, `main.rs`, `mod.rs`) and
/// directories, each with the files it spans.
fn modules(dir: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            found.insert(name, rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs")
            && !["lib", "main", "mod"].contains(&name.as_str())
        {
            found.insert(name, vec![path]);
        }
    }
    found
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The names `source` reaches through `prefix` (`crate::` or `super::`): `prefix name` and
/// each name of `prefix{a, b::{c, d}}`, over lines too. Comment lines are skipped.
fn named(source: &str, prefix: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(prefix) {
        // A longer word ending in the prefix (`my_crate::`) is not it.
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(group) = rest.strip_prefix('{') else {
            names.insert(ident(rest));
            continue;
        };
        // The first segment of each item of the group, at its outer level.
        let mut depth = 0;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                c if item_start && !c.is_whitespace() => {
                    names.insert(ident(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    names.remove("");
    names
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// What the crate root re-exports from each module (`pub use audit::{AuditLog, audited};`):
/// the item's name, and its module, so that `crate::AuditLog` counts as naming `audit`.
fn reexports(dir: &Path, modules: &BTreeMap<String, Vec<PathBuf>>) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    for root in ["lib.rs", "main.rs", "mod.rs"] {
        let Ok(source) = std::fs::read_to_string(dir.join(root)) else {
            continue;
        };
        for statement in source.split(';') {
            let Some(path) = statement
                .trim_start()
                .split_once("use ")
                .filter(|(visibility, _)| visibility.trim().starts_with("pub"))
                .map(|(_, path)| path.trim())
            else {
                continue;
            };
            let module = ident(path);
            if !modules.contains_key(&module) {
                continue;
            }
            let rest = &path[module.len()..];
            for word in rest.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !word.is_empty() && word != "as" && word != "self" {
                    items.insert(word.to_owned(), module.clone());
                }
            }
        }
    }
    items
}

/// The graph of the modules in `dir`, edges through `prefix`.
fn graph(dir: &Path, prefix: &str) -> Graph {
    let modules = modules(dir);
    let reexported = reexports(dir, &modules);
    modules
        .iter()
        .map(|(name, files)| {
            let mut edges = BTreeSet::new();
            for file in files {
                // A directory module's own files reach their siblings through `super::`,
                // which is their parent: only `crate::` edges count at the top level, and
                // only the files directly in `dir` count for `super::`.
                if prefix == "super::" && file.parent() != Some(dir) {
                    continue;
                }
                let source = std::fs::read_to_string(file).unwrap();
                edges.extend(
                    named(&source, prefix)
                        .into_iter()
                        .map(|n| match reexported.get(&n) {
                            Some(module) if !modules.contains_key(&n) => module.clone(),
                            _ => n,
                        })
                        .filter(|n| n != name && modules.contains_key(n)),
                );
            }
            (name.clone(), edges)
        })
        .collect()
}

/// A circle in `graph`, as the path around it, if there is one.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_circle_between_the_modules_of_a_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut crates: Vec<PathBuf> = crate::crate_dirs(root)
        .into_iter()
        .map(|dir| dir.join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.push(root.join("xtask/src"));
    let mut circles = Vec::new();
    let mut scopes = 0;
    for src in crates {
        let mut dirs = vec![(src.clone(), "crate::")];
        dirs.extend(
            modules(&src)
                .keys()
                .map(|m| src.join(m))
                .filter(|d| d.is_dir())
                .map(|d| (d, "super::")),
        );
        for (dir, prefix) in dirs {
            scopes += 1;
            let mut graph = graph(&dir, prefix);
            // Every circle, not only the first: each one found is cut where it closes.
            while let Some(found) = circle(&graph) {
                circles.push(format!("{}: {}", dir.display(), found.join(" → ")));
                let (from, to) = (&found[found.len() - 2], &found[found.len() - 1]);
                graph.get_mut(from).unwrap().remove(to);
            }
        }
    }
    assert!(scopes > 15, "found the crates ({scopes})");
    assert!(
        circles.is_empty(),
        "modules that import each other in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_check_sees_paths_groups_and_circles() {
    let source = "use crate::a::X;\nuse crate::{b, c::{Y, Z},\n    h};\n// crate::commented\nlet z = my_crate::d;\nf(crate::e::g());";
    let names: Vec<_> = named(source, "crate::").into_iter().collect();
    assert_eq!(names, ["a", "b", "c", "e", "h"]);
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), BTreeSet::from([to.to_owned()])))
        .collect();
    assert_eq!(circle(&graph).unwrap(), ["a", "b", "c", "a"]);
    let mut open = graph.clone();
    open.remove("c");
    assert_eq!(circle(&open), None);
}
