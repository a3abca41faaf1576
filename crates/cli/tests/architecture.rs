//! The workspace's shape as its design says: the crates' arrows as docs/design.md
//! pictures them, and within each crate, the modules import one another one way only. A
//! module's imports are the `crate::NAME` paths in its files (comments and test modules
//! aside); a circle among them fails the test, named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates' source directories.
fn crate_sources() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files of test modules declared `#[cfg(test)] mod NAME;` in `files`.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        let stem = f.file_stem().unwrap().to_str().unwrap();
        let dir = if matches!(stem, "lib" | "main" | "mod") {
            f.parent().unwrap().to_path_buf()
        } else {
            f.with_extension("")
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0] != "#[cfg(test)]" {
                continue;
            }
            let name = w[1]
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ")
                .strip_prefix("mod ")
                .and_then(|r| r.strip_suffix(';'));
            if let Some(name) = name {
                out.insert(dir.join(format!("{name}.rs")));
                out.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    out
}

/// The code of `text` before its inline test module, without comments.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut after_cfg_test = false;
    for line in text.lines() {
        let t = line.trim();
        let module = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        if after_cfg_test && module.starts_with("mod ") && t.ends_with('{') {
            break;
        }
        after_cfg_test = t == "#[cfg(test)]";
        if !t.starts_with("//") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The names following `crate::` in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(i, _)| {
            // Not `fibre_crate::` or the like.
            *i == 0
                || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_'
        })
        .map(|(i, _)| {
            code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .filter(|n: &String| !n.is_empty())
        .collect()
}

/// Each top-level module of the crate at `src` and the other top-level modules it imports.
fn module_imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let tests = test_files(&files);
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files.iter().filter(|f| !tests.contains(*f)) {
        let rel = f.strip_prefix(src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let paths = crate_paths(&code(&std::fs::read_to_string(f).unwrap()));
        imports
            .entry(top.clone())
            .or_default()
            .extend(paths.into_iter().filter(|p| *p != top));
    }
    let modules: BTreeSet<String> = imports.keys().cloned().collect();
    for targets in imports.values_mut() {
        targets.retain(|t| modules.contains(t));
    }
    imports
}

/// A circle of imports among `imports`, if there is one: its modules in order.
fn a_circle(imports: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // 0: not seen, 1: on the path, 2: done.
    fn visit(
        m: &str,
        imports: &BTreeMap<String, BTreeSet<String>>,
        mark: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        mark.insert(m.to_string(), 1);
        path.push(m.to_string());
        for t in &imports[m] {
            match mark.get(t).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == t).unwrap();
                    let mut circle = path[from..].to_vec();
                    circle.push(t.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(t, imports, mark, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        mark.insert(m.to_string(), 2);
        None
    }
    let mut mark = BTreeMap::new();
    for m in imports.keys() {
        if mark.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, imports, &mut mark, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_circle_of_imports_between_its_modules() {
    let sources = crate_sources();
    assert!(sources.len() >= 10, "the workspace's crates: {sources:?}");
    let mut circles = Vec::new();
    for src in &sources {
        let imports = module_imports(src);
        if let Some(c) = a_circle(&imports) {
            circles.push(format!("{}: {}", src.display(), c.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "circles of imports:\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_is_found_where_there_is_one() {
    let imports: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_string(), t.into_iter().map(String::from).collect()))
    .collect();
    let c = a_circle(&imports).expect("a -> b -> c -> a");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
    let mut one_way = imports.clone();
    one_way.get_mut("c").unwrap().clear();
    assert_eq!(a_circle(&one_way), None);
    assert_eq!(
        crate_paths("use crate::answers::DestAnswer;\nfibre_crate::x; let y = crate::hop::Hop;"),
        ["answers", "hop"].into_iter().map(String::from).collect()
    );
}

/// The workspace crates each crate's manifest names under `[dependencies]`, by their
/// directory names (`fibre-lpm` is `lpm`).
fn manifest_arrows(crate_dir: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    let mut out = BTreeSet::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_dependencies = t == "[dependencies]";
            continue;
        }
        if let Some(rest) = t.strip_prefix("fibre-").filter(|_| in_dependencies) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            out.insert(name);
        }
    }
    out
}

/// The picture of the crates' arrows in docs/design.md: each line `CRATE -> A, B (...)`.
fn pictured_arrows() -> BTreeMap<String, BTreeSet<String>> {
    let design = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/design.md");
    let text = std::fs::read_to_string(design).unwrap();
    let start = text
        .find("The crates and their arrows")
        .expect("the picture of the crates");
    let block = &text[start..];
    let block = &block[block.find("```text\n").unwrap() + 8..];
    let block = &block[..block.find("```").unwrap()];
    block
        .lines()
        .map(|l| {
            let (from, to) = l.split_once("->").unwrap();
            let to = to
                .split(',')
                .map(|t| t.split('(').next().unwrap().trim().to_string())
                .filter(|t| !t.is_empty())
                .collect();
            (from.trim().to_string(), to)
        })
        .collect()
}

#[test]
fn the_design_pictures_the_crates_arrows_as_the_manifests_make_them() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut made = BTreeMap::new();
    for src in crate_sources() {
        let dir = src.parent().unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap().to_string();
        made.insert(name, manifest_arrows(&crates.join(dir)));
    }
    assert_eq!(pictured_arrows(), made);
}
