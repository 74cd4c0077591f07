//! The crate's modules form layers, and imports run one way: down. This test
//! parses every file under `src/` (tests/support/layers_check.rs) and fails
//! on any path to the crate's own items (a `use`, a path in code, a type, a
//! pattern, a bound, an attribute or a macro's tokens, in code or in its
//! unit tests, through `super::`, `self::`, an alias of the crate or a name
//! re-exported at its root) that names a module not listed before the
//! importing one in [`LAYERS`]; on any such path it cannot place; and on any
//! module missing from the table. Files inside one module must not import
//! each other in a cycle either.
//!
//! A new module is placed in the table on purpose; moving one up or down
//! is a design change, and docs/architecture.md describes the layers.
use std::collections::{BTreeMap, BTreeSet};

#[path = "support/layers_check.rs"]
mod check;

use check::Krate;

/// The layers, bottom first; within a layer, a module may use the modules
/// before it. `lib` and `main` are the crate roots.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["clock", "ip", "secret", "metrics", "http_core"]),
    (
        "parts",
        &[
            "tls",
            "config",
            "logging",
            "trace",
            "routes",
            "store",
            "error",
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

/// Each use that runs up the layers (or sideways to a later module), and
/// each crate path that could not be placed.
fn upward(krate: &Krate) -> Vec<String> {
    let mut found = Vec::new();
    for source in &krate.sources {
        let (refs, errors) = krate.refs(source);
        found.extend(errors);
        let Some((from_layer, from)) = place(&source.owner) else {
            continue;
        };
        for r in refs {
            let Some((to_layer, to)) = place(&r.path[0]) else {
                continue;
            };
            if to > from {
                found.push(format!(
                    "{}:{}: {} ({}) uses {} = crate::{} ({})",
                    source.file,
                    r.line,
                    source.owner,
                    LAYERS[from_layer].0,
                    r.written,
                    r.path.join("::"),
                    LAYERS[to_layer].0,
                ));
            }
        }
    }
    found
}

/// The cycles among the files of one top-level module.
fn cycles(krate: &Krate) -> Vec<String> {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for source in &krate.sources {
        let module = &source.module;
        if module.is_empty() || module.iter().any(|m| m == "tests") {
            continue;
        }
        let (refs, _) = krate.refs(source);
        // Unit tests may use their parent; only the code is layered. A
        // re-export (`pub use`) passes a child's item on; it is no use of it.
        // A parent reaches a child through `use child::X`; a call written
        // `child::f()` is the parent driving its own part, not an import.
        for r in refs
            .iter()
            .filter(|r| !r.in_test && !r.reexport && !r.inline_child)
        {
            if let Some(to) = krate.file_of(&r.path) {
                // Within one top-level module, and not a file naming itself.
                if to != *module && to[0] == module[0] {
                    edges.entry(module.clone()).or_default().insert(to);
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
    cycles
}

#[test]
fn every_module_is_in_a_layer() {
    let krate = Krate::read();
    let mut modules: BTreeSet<&str> = krate.top.iter().map(String::as_str).collect();
    modules.extend(krate.sources.iter().map(|s| s.owner.as_str()));
    let missing: Vec<_> = modules.iter().filter(|m| place(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "modules in no layer of tests/layers.rs: {missing:?}"
    );
}

#[test]
fn imports_run_down_the_layers() {
    let found = upward(&Krate::read());
    assert!(
        found.is_empty(),
        "imports that run up the layers (or sideways to a later module), or that name no module:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_files_of_a_module_import_one_another_without_a_cycle() {
    let cycles = cycles(&Krate::read());
    assert!(
        cycles.is_empty(),
        "files that import one another in a cycle:\n{}",
        cycles.join("\n")
    );
}

/// The layer check on a crate made of `(path under src/, text)` pairs; its
/// `lib.rs` declares `clock` (bottom), `store` (middle) and `app` (top).
fn check(files: &[(&str, &str)]) -> Vec<String> {
    let mut all = vec![(
        "lib.rs".to_string(),
        "mod clock; mod store; mod app;".to_string(),
    )];
    all.extend(files.iter().map(|(p, t)| (p.to_string(), t.to_string())));
    upward(&Krate::from_sources(&all))
}

/// `check` finds exactly one problem, at `file:line`, and it mentions `what`.
fn caught(files: &[(&str, &str)], at: &str, what: &str) {
    let found = check(files);
    assert!(
        found.len() == 1 && found[0].starts_with(at) && found[0].contains(what),
        "expected one problem at {at} naming {what}, found {found:?}"
    );
}

#[test]
fn the_checker_sees_imports_and_not_comments() {
    let app = ("app.rs", "pub fn x() {}");
    assert!(check(&[
        app,
        ("clock.rs", "// crate::app::x\n/// crate::app\nfn f() {}")
    ])
    .is_empty());
    let found = check(&[
        app,
        ("clock.rs", "\nuse crate::{store::{self, S}, app::x};"),
    ]);
    let found: Vec<_> = found
        .iter()
        .map(|f| f.rsplit(" = ").next().unwrap())
        .collect();
    assert_eq!(
        found,
        [
            "crate::store (parts)",
            "crate::store::S (parts)",
            "crate::app::x (application)"
        ]
    );
    caught(
        &[app, ("clock.rs", "fn f() -> crate::app::T { todo!() }")],
        "src/clock.rs:1",
        "crate::app::T",
    );
    caught(
        &[app, ("clock.rs", "fn f<T: crate::app::Tr>() {}")],
        "src/clock.rs:1",
        "crate::app::Tr",
    );
    caught(
        &[app, ("clock.rs", "fn f() { crate::app::m!(); }")],
        "src/clock.rs:1",
        "crate::app::m",
    );
    caught(
        &[app, ("clock.rs", "fn f() { vec![crate::app::x()]; }")],
        "src/clock.rs:1",
        "crate::app::x",
    );
    caught(
        &[app, ("clock.rs", "#[crate::app::attr]\nfn f() {}")],
        "src/clock.rs:1",
        "crate::app::attr",
    );
    caught(
        &[app, ("clock.rs", "use crate::app::*;")],
        "src/clock.rs:1",
        "crate::app",
    );
    caught(
        &[
            app,
            (
                "clock.rs",
                "mod inner { mod deeper { use super::super::super::app::x; } }",
            ),
        ],
        "src/clock.rs:1",
        "crate::app::x",
    );
    assert!(check(&[
        app,
        ("app.rs", "use crate::{clock::N, store::S};"),
        ("store.rs", "use crate::clock::N;")
    ])
    .is_empty());
    assert_eq!(place("clock").unwrap().0, 0);
    assert!(place("pipeline").unwrap().1 > place("proxy").unwrap().1);
}

#[test]
fn a_raw_string_hides_no_path_and_makes_none() {
    let text = "fn f() -> &'static str { r#\"crate::app \" \"# }\nfn g() { crate::app::x(); }";
    caught(&[("clock.rs", text)], "src/clock.rs:2", "crate::app::x");
    assert!(check(&[("clock.rs", "fn f() -> &'static str { r\"crate::app\" }")]).is_empty());
}

#[test]
fn an_alias_of_the_crate_is_followed() {
    caught(
        &[("clock.rs", "use crate as c;\nfn f() { c::app::x() }")],
        "src/clock.rs:2",
        "crate::app::x",
    );
    caught(
        &[(
            "clock.rs",
            "extern crate self as c;\nfn f() { c::app::x() }",
        )],
        "src/clock.rs:2",
        "crate::app::x",
    );
    caught(
        &[(
            "clock.rs",
            "use crate::{self as c};\nuse c as d;\nfn f() { d::app::x() }",
        )],
        "src/clock.rs:3",
        "crate::app::x",
    );
    caught(
        &[("clock.rs", "use crate as c;\nfn f() { m!(c::app::x) }")],
        "src/clock.rs:2",
        "crate::app::x",
    );
}

#[test]
fn super_and_self_are_resolved_from_the_file() {
    caught(
        &[("clock.rs", "fn f() { super::app::x() }")],
        "src/clock.rs:1",
        "crate::app::x",
    );
    caught(
        &[("clock/now.rs", "use super::super::app::x;")],
        "src/clock/now.rs:1",
        "crate::app::x",
    );
    caught(
        &[("clock.rs", "mod t { use super::super::app; }")],
        "src/clock.rs:1",
        "crate::app",
    );
    caught(
        &[("clock.rs", "use super::*;")],
        "src/clock.rs:1",
        "whole crate root",
    );
    caught(
        &[("clock.rs", "fn f() { super::super::x() }")],
        "src/clock.rs:1",
        "above the crate root",
    );
    assert!(check(&[(
        "clock/now.rs",
        "use super::Tick; use self::inner::X; mod inner {}"
    )])
    .is_empty());
}

#[test]
fn code_after_a_test_attribute_is_checked() {
    let text = "#[cfg(test)]\nmod tests { use super::*; }\n\nfn f() { crate::app::x() }";
    caught(&[("clock.rs", text)], "src/clock.rs:4", "crate::app::x");
    let text = "#[cfg(test)]\nmod tests {\n    use crate::app::x;\n}";
    caught(&[("clock.rs", text)], "src/clock.rs:3", "crate::app::x");
}

#[test]
fn an_unknown_first_segment_fails() {
    caught(
        &[("clock.rs", "use crate::nowhere::X;")],
        "src/clock.rs:1",
        "`nowhere`",
    );
    caught(
        &[("clock.rs", "fn f() { self::super::nowhere::x() }")],
        "src/clock.rs:1",
        "`nowhere`",
    );
}

#[test]
fn a_root_reexport_is_traced_to_its_module() {
    let lib = (
        "lib.rs",
        "mod clock; mod store; mod app; pub use app::Runner; pub(crate) use crate::app::Other as Renamed; pub use Runner as Again;",
    );
    let files = |clock| {
        let all: Vec<(String, String)> = [lib, ("clock.rs", clock)]
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect();
        upward(&Krate::from_sources(&all))
    };
    let found = files("use crate::Runner;\nfn f() -> crate::Renamed { crate::Again }");
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[2].starts_with("src/clock.rs:2") && found[2].contains("crate::app::Runner"));
    assert!(found[0].starts_with("src/clock.rs:1") && found[0].contains("crate::app::Runner"));
    assert!(found[1].starts_with("src/clock.rs:2") && found[1].contains("crate::app::Other"));
}

#[test]
fn the_cycle_check_sees_parents_and_children() {
    let store = |parent: &str| {
        cycles(&Krate::from_sources(&[
            ("lib.rs".into(), "mod store;".into()),
            ("store/mod.rs".into(), parent.into()),
            ("store/a.rs".into(), "fn x() {}".into()),
            ("store/b.rs".into(), "use super::S;".into()),
        ]))
    };
    // A parent driving its child (`a::x()`) while the child uses the parent.
    assert!(store("mod a; mod b; struct S; fn f() { b::x() }").is_empty());
    assert_eq!(
        store("mod a; mod b; struct S; use b::x;"),
        [
            "store -> store::b -> store",
            "store::b -> store -> store::b"
        ]
    );
    let krate = Krate::from_sources(&[
        ("lib.rs".into(), "mod store;".into()),
        ("store/mod.rs".into(), "mod a; mod b; use a::x;".into()),
        ("store/a.rs".into(), "use super::b::Y;".into()),
        (
            "store/b.rs".into(),
            "use crate::store::f;\n#[cfg(test)]\nmod t { use super::super::a; }".into(),
        ),
    ]);
    let found = cycles(&krate);
    assert!(
        found
            .iter()
            .any(|c| c == "store -> store::a -> store::b -> store"),
        "{found:?}"
    );
}
