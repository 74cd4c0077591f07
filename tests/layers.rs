//! The crate's modules form layers, and imports run one way: down. This test
//! reads `src/` and fails on any `crate::` path (a `use` or an inline path,
//! in code or in its unit tests) that names a module not listed before the
//! importing one in [`LAYERS`], and on any module missing from the table.
//! Files inside one module must not import each other in a cycle either.
//!
//! A new module is placed in the table on purpose; moving one up or down
//! is a design change, and docs/architecture.md describes the layers.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, bottom first; within a layer, a module may use the modules
/// before it. `lib` and `main` are the crate roots.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &["clock", "ip", "secret", "metrics", "http", "error"],
    ),
    (
        "parts",
        &[
            "tls",
            "config",
            "logging",
            "routes",
            "store",
            "auth",
            "ratelimit",
            "h1",
        ],
    ),
    ("serving", &["proxy", "server", "keys_service", "pipeline"]),
    (
        "application",
        &[
            "admin", "app", "signals", "cli", "demo", "wire", "lib", "main",
        ],
    ),
];

/// A module's place: (layer index, position in the whole order).
fn place(module: &str) -> Option<(usize, usize)> {
    LAYERS
        .iter()
        .enumerate()
        .flat_map(|(l, (_, ms))| ms.iter().map(move |m| (l, *m)))
        .enumerate()
        .find(|(_, (_, m))| *m == module)
        .map(|(i, (l, _))| (l, i))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/` (`src/a/b.rs` and `src/a/b/mod.rs`
/// are both `a::b`; `src/lib.rs` is `lib`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The text with comments, string literals and character literals blanked
/// (line breaks kept, so line numbers stay right).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, &b[i..end]);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let end = text[i + 2..].find("*/").map_or(b.len(), |p| i + 2 + p + 2);
            blank(&mut out, &b[i..end]);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            blank(&mut out, &b[i..end]);
            i = end;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n', '\''), not a lifetime.
            let end = b[i + 1..]
                .iter()
                .skip(1)
                .position(|&c| c == b'\'')
                .map_or(b.len(), |p| i + 2 + p + 1);
            blank(&mut out, &b[i..end]);
            i = end;
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Each path that starts with `root::` (`crate`, `super`, `self`): its line
/// and its segments, with `{a::X, b::Y}` groups expanded one level.
fn paths_from(code: &str, root: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let needle = format!("{root}::");
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(p) = code[at..].find(&needle) {
        let start = at + p;
        at = start + needle.len();
        if start > 0 && (is_ident(b[start - 1]) || b[start - 1] == b':' || b[start - 1] == b'$') {
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let mut segs = vec![];
        let mut i = at;
        loop {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            if i > s {
                segs.push(code[s..i].to_string());
            }
            if code[i..].starts_with("::") && i + 2 < b.len() && is_ident(b[i + 2]) {
                i += 2;
                continue;
            }
            let group = if code[i..].starts_with("::{") {
                Some(i + 3)
            } else {
                (segs.is_empty() && code[i..].starts_with('{')).then_some(i + 1)
            };
            if let Some(g) = group {
                // A group: each item's leading segments (before any group of its own).
                for item in group_items(&code[g..]) {
                    let lead: Vec<String> = item
                        .split("::")
                        .map(str::trim)
                        .take_while(|s| !s.is_empty() && s.bytes().all(is_ident))
                        .map(str::to_string)
                        .collect();
                    if !lead.is_empty() && lead[0] != "self" {
                        let mut g = segs.clone();
                        g.extend(lead);
                        found.push((line, g));
                    }
                }
                segs.clear();
            }
            break;
        }
        if !segs.is_empty() {
            found.push((line, segs));
        }
    }
    found
}

/// The items of a `{…}` group whose text starts just after its `{`, split at
/// its own commas (not those of nested groups).
fn group_items(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&text[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// `code` with its `pub use …;` and `pub(…) use …;` statements blanked.
fn without_reexports(code: &str) -> String {
    let mut out = code.to_string();
    for start in ["pub use ", "pub(crate) use ", "pub(super) use "] {
        let mut at = 0;
        while let Some(p) = out[at..].find(start) {
            let begin = at + p;
            let end = out[begin..].find(';').map_or(out.len(), |e| begin + e);
            let blanked: String = out[begin..end]
                .chars()
                .map(|c| if c == '\n' { c } else { ' ' })
                .collect();
            out.replace_range(begin..end, &blanked);
            at = end;
        }
    }
    out
}

/// What the crate's files import from one another, by module.
struct Crate {
    /// Module path of each file, and its code.
    files: BTreeMap<Vec<String>, (PathBuf, String)>,
}

impl Crate {
    fn read() -> Crate {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        let files = paths
            .into_iter()
            .map(|p| {
                let code = code_only(&fs::read_to_string(&p).unwrap());
                (module_path(&src, &p), (p, code))
            })
            .collect();
        Crate { files }
    }

    /// The file module a path names: the longest prefix that is a file.
    fn file_of(&self, path: &[String]) -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.files.contains_key(p))
    }

    /// Each (line, absolute module path) a file's code names.
    fn references(&self, module: &[String], code: &str) -> Vec<(usize, Vec<String>)> {
        let mut refs = paths_from(code, "crate");
        let parent = &module[..module.len().saturating_sub(1)];
        for (line, mut segs) in paths_from(code, "super") {
            let mut base = parent.to_vec();
            while segs.first().is_some_and(|s| s == "super") {
                segs.remove(0);
                base.pop();
            }
            base.extend(segs);
            refs.push((line, base));
        }
        for (line, segs) in paths_from(code, "self") {
            let mut base = module.to_vec();
            base.extend(segs);
            refs.push((line, base));
        }
        refs
    }
}

#[test]
fn every_module_is_in_a_layer() {
    let krate = Crate::read();
    let top: BTreeSet<&str> = krate.files.keys().map(|m| m[0].as_str()).collect();
    let missing: Vec<_> = top.iter().filter(|m| place(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "modules in no layer of tests/layers.rs: {missing:?}"
    );
}

#[test]
fn imports_run_down_the_layers() {
    let krate = Crate::read();
    let mut upward = Vec::new();
    for (module, (file, code)) in &krate.files {
        let Some((from_layer, from)) = place(&module[0]) else {
            continue;
        };
        for (line, path) in paths_from(code, "crate") {
            let Some((to_layer, to)) = place(&path[0]) else {
                continue;
            };
            if to > from {
                upward.push(format!(
                    "{}:{line}: {} ({}) uses crate::{} ({})",
                    file.display(),
                    module[0],
                    LAYERS[from_layer].0,
                    path.join("::"),
                    LAYERS[to_layer].0,
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers (or sideways to a later module):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_files_of_a_module_import_one_another_without_a_cycle() {
    let krate = Crate::read();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, (_, code)) in &krate.files {
        // Unit tests may use their parent; only the code is layered. A
        // re-export (`pub use`) passes a child's item on; it is no use of it.
        let code = without_reexports(code.split("#[cfg(test)]").next().unwrap_or(""));
        let code = code.as_str();
        if module.last().is_some_and(|m| m == "tests") {
            continue;
        }
        for (_, path) in krate.references(module, code) {
            if let Some(to) = krate.file_of(&path) {
                // Within one top-level module, and not a file naming itself.
                if to != *module && to[0] == module[0] {
                    edges.entry(module.clone()).or_default().insert(to);
                }
            }
        }
        // `use child::X` in a parent names its own child module.
        for line in code.lines() {
            let line = line.trim_start();
            if let Some(rest) = line.strip_prefix("use ") {
                let child = rest.split("::").next().unwrap_or("");
                let mut path = module.clone();
                if module.len() == 1 && (module[0] == "lib" || module[0] == "main") {
                    continue;
                }
                path.push(child.to_string());
                if krate.files.contains_key(&path) {
                    edges.entry(module.clone()).or_default().insert(path);
                }
            }
        }
    }
    // Any cycle shows as a path back to its start.
    let mut cycles = Vec::new();
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let names: Vec<_> = trail.iter().map(|m| m.join("::")).collect();
                    cycles.push(format!("{} -> {}", names.join(" -> "), start.join("::")));
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    assert!(
        cycles.is_empty(),
        "files that import one another in a cycle:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_checker_sees_imports_and_not_comments() {
    let code = code_only(
        "use crate::a::{b::{C, D}, d};\nuse crate::{x::Y, z};\n// crate::hidden::X\nlet s = \"crate::str\";\nfoo(crate::e::f());\n",
    );
    let found: Vec<_> = paths_from(&code, "crate")
        .into_iter()
        .map(|(l, p)| (l, p.join("::")))
        .collect();
    assert_eq!(
        found,
        [
            (1, "a::b".to_string()),
            (1, "a::d".to_string()),
            (2, "x::Y".to_string()),
            (2, "z".to_string()),
            (5, "e::f".to_string())
        ]
    );
    assert_eq!(place("clock").unwrap().0, 0);
    assert!(place("pipeline").unwrap().1 > place("proxy").unwrap().1);
}
