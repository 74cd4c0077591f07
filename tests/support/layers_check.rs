//! The parser behind tests/layers.rs: it reads each file under `src/` with
//! `syn`, walks every item (test modules and inline `mod x { .. }` blocks
//! too) and resolves each path that names the crate: `use` trees with their
//! groups, renames and globs, and paths in expressions, types, patterns,
//! bounds, attributes and macro token streams. `super::` and `self::` are
//! resolved from the module the path sits in, aliases of the crate
//! (`use crate as c;`, `extern crate self as c;`) are followed, and a name
//! re-exported at the crate root is traced to the module it comes from.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// One file of the crate, parsed.
pub(crate) struct Source {
    /// The file, as the messages name it.
    pub(crate) file: String,
    /// Its module path (`[]` for the crate roots `lib.rs` and `main.rs`).
    pub(crate) module: Vec<String>,
    /// The module that owns it for the layers: its top-level module, or
    /// `lib` / `main` for the roots.
    pub(crate) owner: String,
    ast: syn::File,
}

/// One resolved use of the crate's own items.
pub(crate) struct Ref {
    pub(crate) line: usize,
    /// The absolute path, from the crate root, with root re-exports traced.
    pub(crate) path: Vec<String>,
    /// The path as written.
    pub(crate) written: String,
    /// Inside an item under `#[cfg(test)]`.
    pub(crate) in_test: bool,
    /// Part of a `pub use` (a re-export passes an item on; it is no use of it).
    pub(crate) reexport: bool,
    /// A plain path into a child file module (`child::f()`) outside a `use`.
    pub(crate) inline_child: bool,
}

pub(crate) struct Krate {
    pub(crate) sources: Vec<Source>,
    /// The crate's top-level modules.
    pub(crate) top: BTreeSet<String>,
    /// Names `pub use`d at the crate root, and the absolute path each comes
    /// from (`None`: from another crate).
    reexports: BTreeMap<String, Option<Vec<String>>>,
    /// Other items defined in the crate root (they belong to `lib`).
    root_items: BTreeSet<String>,
    /// The module paths that are files (for the cycle check).
    pub(crate) file_modules: BTreeSet<Vec<String>>,
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The module path of a file from its place under `src/` (`a/b.rs` and
/// `a/b/mod.rs` are both `a::b`; the roots are `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return vec![];
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn attrs_of(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item::*;
    match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]`, or a `cfg` that names `test` at all (`all(test, …)`).
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.clone().into_iter().any(
                |t| matches!(&t, TokenTree::Ident(i) if i == "test")
                    || matches!(&t, TokenTree::Group(g) if g.stream().into_iter().any(
                        |t| matches!(&t, TokenTree::Ident(i) if i == "test")))))
    })
}

/// A path as the walk met it, before resolution.
struct Raw {
    line: usize,
    scope: Vec<String>,
    segs: Vec<String>,
    glob: bool,
    /// Part of a `use` item.
    in_use: bool,
    in_test: bool,
    reexport: bool,
}

/// `use … as name` of a path that may be the crate root.
struct Rename {
    scope: Vec<String>,
    segs: Vec<String>,
    name: String,
}

struct Walker {
    scope: Vec<String>,
    tests: usize,
    reexport: bool,
    in_use: bool,
    raws: Vec<Raw>,
    renames: Vec<Rename>,
    /// Names that can start a crate path in token streams, besides the keywords.
    words: BTreeSet<String>,
}

impl Walker {
    fn push(&mut self, line: usize, segs: Vec<String>, glob: bool) {
        let in_use = self.in_use;
        self.raws.push(Raw {
            line,
            scope: self.scope.clone(),
            segs,
            glob,
            in_use,
            in_test: self.tests > 0,
            reexport: self.reexport,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut segs = prefix.clone();
                if n.ident != "self" || segs.is_empty() {
                    segs.push(n.ident.to_string());
                }
                self.push(n.ident.span().start().line, segs, false);
            }
            syn::UseTree::Rename(r) => {
                let mut segs = prefix.clone();
                if r.ident != "self" || segs.is_empty() {
                    segs.push(r.ident.to_string());
                }
                self.renames.push(Rename {
                    scope: self.scope.clone(),
                    segs: segs.clone(),
                    name: r.rename.to_string(),
                });
                self.push(r.ident.span().start().line, segs, false);
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                self.push(line, prefix.clone(), true);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths in a token stream (a macro's input, an attribute's arguments):
    /// a keyword, `$crate` or a crate alias followed by `::ident` segments.
    fn tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let colons = |i: usize| {
            matches!((tts.get(i), tts.get(i + 1)), (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
        };
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let word = id.to_string();
                    let dollar =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let after_colons = i >= 2 && colons(i - 2);
                    let starts = ["crate", "super", "self"].contains(&word.as_str())
                        || self.words.contains(&word);
                    if starts && !after_colons && colons(i + 1) {
                        let mut segs = vec![if dollar { "crate".to_string() } else { word }];
                        let mut j = i + 1;
                        while colons(j) {
                            match tts.get(j + 2) {
                                Some(TokenTree::Ident(n)) => segs.push(n.to_string()),
                                _ => break,
                            }
                            j += 3;
                        }
                        if segs.len() > 1 {
                            self.push(id.span().start().line, segs, false);
                        }
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Walker {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let test = is_test(attrs_of(item));
        self.tests += usize::from(test);
        visit::visit_item(self, item);
        self.tests -= usize::from(test);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        for a in &m.attrs {
            self.visit_attribute(a);
        }
        if let Some((_, items)) = &m.content {
            self.scope.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.scope.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        for a in &u.attrs {
            self.visit_attribute(a);
        }
        self.reexport = !matches!(u.vis, syn::Visibility::Inherited);
        self.in_use = true;
        self.use_tree(&mut vec![], &u.tree);
        self.in_use = false;
        self.reexport = false;
    }

    fn visit_item_extern_crate(&mut self, e: &'ast syn::ItemExternCrate) {
        if let Some((_, name)) = &e.rename {
            self.renames.push(Rename {
                scope: vec![],
                segs: vec![if e.ident == "self" {
                    "crate".into()
                } else {
                    e.ident.to_string()
                }],
                name: name.to_string(),
            });
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() > 1 && path.leading_colon.is_none() {
            let segs = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let line = path.segments[0].ident.span().start().line;
            self.push(line, segs, false);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }

    fn visit_meta_list(&mut self, list: &'ast syn::MetaList) {
        self.tokens(list.tokens.clone());
        visit::visit_meta_list(self, list);
    }
}

fn walker(module: &[String], words: BTreeSet<String>) -> Walker {
    Walker {
        scope: module.to_vec(),
        tests: 0,
        reexport: false,
        in_use: false,
        raws: vec![],
        renames: vec![],
        words,
    }
}

fn walk(module: &[String], ast: &syn::File, words: BTreeSet<String>) -> Walker {
    let mut w = walker(module, words);
    w.visit_file(ast);
    w
}

/// `segs` from `scope` made absolute, if it starts with `crate`, `super`,
/// `self` or an alias of the crate root; `Err` if `super` climbs above it.
fn absolute(
    scope: &[String],
    segs: &[String],
    aliases: &BTreeSet<String>,
) -> Option<Result<Vec<String>, String>> {
    let first = segs.first()?;
    if first == "crate" || aliases.contains(first) {
        return Some(Ok(segs[1..].to_vec()));
    }
    if first != "super" && first != "self" {
        return None;
    }
    let mut base = scope.to_vec();
    let mut i = 0;
    while i < segs.len() && (segs[i] == "super" || segs[i] == "self") {
        if segs[i] == "super" && base.pop().is_none() {
            return Some(Err("`super` above the crate root".into()));
        }
        i += 1;
    }
    base.extend_from_slice(&segs[i..]);
    Some(Ok(base))
}

impl Krate {
    /// The crate from `(path under src/, text)` pairs.
    pub(crate) fn from_sources(files: &[(String, String)]) -> Krate {
        let mut sources: Vec<Source> = files
            .iter()
            .map(|(rel, text)| {
                let ast = syn::parse_file(text)
                    .unwrap_or_else(|e| panic!("src/{rel}: does not parse: {e}"));
                let module = module_of(Path::new(rel));
                let stem = Path::new(rel).file_stem().unwrap().to_string_lossy();
                let owner = module.first().cloned().unwrap_or_else(|| stem.into_owned());
                Source {
                    file: format!("src/{rel}"),
                    module,
                    owner,
                    ast,
                }
            })
            .collect();
        // `#[path = "…"] mod name;` moves a file (and the files under its
        // folder, if it is a mod.rs) to the declaring module.
        let mut moves = Vec::new();
        for (s, (rel, _)) in sources.iter().zip(files) {
            for item in &s.ast.items {
                let syn::Item::Mod(m) = item else { continue };
                for a in &m.attrs {
                    let syn::Meta::NameValue(nv) = &a.meta else {
                        continue;
                    };
                    let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(p),
                        ..
                    }) = &nv.value
                    else {
                        continue;
                    };
                    if nv.path.is_ident("path") {
                        let dir = Path::new(rel).parent().unwrap_or(Path::new(""));
                        let target = normalize(&dir.join(p.value()));
                        let mut to = s.module.clone();
                        to.push(m.ident.to_string());
                        moves.push((module_of(&target), to));
                    }
                }
            }
        }
        for (from, to) in moves {
            for s in &mut sources {
                if !s.module.is_empty() && s.module.starts_with(&from) {
                    let mut m = to.clone();
                    m.extend_from_slice(&s.module[from.len()..]);
                    s.module = m;
                }
            }
        }
        let mut top: BTreeSet<String> = sources
            .iter()
            .filter_map(|s| s.module.first().cloned())
            .collect();
        let mut reexports = BTreeMap::new();
        let mut root_items = BTreeSet::new();
        let no_aliases = BTreeSet::new();
        for s in sources.iter().filter(|s| s.owner == "lib") {
            for item in &s.ast.items {
                match item {
                    syn::Item::Mod(m) => {
                        top.insert(m.ident.to_string());
                    }
                    syn::Item::Use(u) if !matches!(u.vis, syn::Visibility::Inherited) => {
                        let mut w = walker(&[], BTreeSet::new());
                        w.visit_item_use(u);
                        for r in w.raws.iter().filter(|r| !r.glob) {
                            let name = w
                                .renames
                                .iter()
                                .find(|n| n.segs == r.segs)
                                .map_or_else(|| r.segs.last().unwrap().clone(), |n| n.name.clone());
                            let target = match absolute(&[], &r.segs, &no_aliases) {
                                Some(Ok(p)) => Some(p),
                                _ => r.segs.clone().into(),
                            };
                            reexports.insert(name, target);
                        }
                    }
                    syn::Item::Fn(f) => {
                        root_items.insert(f.sig.ident.to_string());
                    }
                    syn::Item::Struct(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    syn::Item::Enum(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    syn::Item::Const(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    syn::Item::Static(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    syn::Item::Trait(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    syn::Item::Type(i) => {
                        root_items.insert(i.ident.to_string());
                    }
                    _ => {}
                }
            }
        }
        // A re-export of a re-export (`pub use Runner as Again;`) comes from
        // where the first one does.
        for _ in 0..8 {
            let known = reexports.clone();
            for target in reexports.values_mut().flatten() {
                let head = target.first().cloned().unwrap_or_default();
                if let (false, Some(Some(t))) = (top.contains(&head), known.get(&head)) {
                    let mut p = t.clone();
                    p.extend_from_slice(&target[1..]);
                    *target = p;
                }
            }
        }
        // A re-export from another crate (`pub use http::Request;`) names no module.
        for target in reexports.values_mut() {
            if target
                .as_ref()
                .is_some_and(|t| t.first().is_none_or(|f| !top.contains(f)))
            {
                *target = None;
            }
        }
        let file_modules = sources.iter().map(|s| s.module.clone()).collect();
        Krate {
            sources,
            top,
            reexports,
            root_items,
            file_modules,
        }
    }

    /// The crate under `src/`.
    pub(crate) fn read() -> Krate {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        paths.sort();
        let files: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                let rel = p.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
                (rel, std::fs::read_to_string(p).unwrap())
            })
            .collect();
        Krate::from_sources(&files)
    }

    /// Each use of the crate's own items in one file, and each path that
    /// could not be resolved (`file:line: …`).
    pub(crate) fn refs(&self, s: &Source) -> (Vec<Ref>, Vec<String>) {
        let mut words = BTreeSet::new();
        if s.owner == "main" {
            words.insert("mpg_gateway".to_string());
        }
        // The aliases of the crate root, to a fixed point (`use c as d;`).
        let first = walk(&s.module, &s.ast, words.clone());
        let mut aliases = words.clone();
        loop {
            let before = aliases.len();
            for r in &first.renames {
                if let Some(Ok(p)) = absolute(&r.scope, &r.segs, &aliases) {
                    if p.is_empty() {
                        aliases.insert(r.name.clone());
                    }
                }
            }
            if aliases.len() == before {
                break;
            }
        }
        let w = walk(&s.module, &s.ast, aliases.clone());
        let (mut refs, mut errors) = (Vec::new(), Vec::new());
        for raw in &w.raws {
            let written = raw.segs.join("::") + if raw.glob { "::*" } else { "" };
            let at = format!("{}:{}", s.file, raw.line);
            let mut inline_child = false;
            let abs = match absolute(&raw.scope, &raw.segs, &aliases) {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    errors.push(format!("{at}: `{written}`: {e}"));
                    continue;
                }
                None => {
                    // A plain path whose first segment is a child file module.
                    let mut p = raw.scope.clone();
                    p.push(raw.segs[0].clone());
                    if !self.file_modules.contains(&p) {
                        continue;
                    }
                    p.extend_from_slice(&raw.segs[1..]);
                    inline_child = !raw.in_use;
                    p
                }
            };
            let Some(head) = abs.first() else {
                if raw.glob {
                    errors.push(format!(
                        "{at}: `{written}` imports the whole crate root; name the modules"
                    ));
                }
                continue;
            };
            let path = if self.top.contains(head) {
                abs.clone()
            } else if let Some(target) = self.reexports.get(head) {
                let Some(t) = target else { continue };
                let mut p = t.clone();
                p.extend_from_slice(&abs[1..]);
                p
            } else if self.root_items.contains(head) {
                let mut p = vec!["lib".to_string()];
                p.extend_from_slice(&abs);
                p
            } else {
                errors.push(format!(
                    "{at}: `{written}` starts with `{head}`, which is no module of the crate \
                     and no name re-exported at its root"
                ));
                continue;
            };
            refs.push(Ref {
                line: raw.line,
                path,
                written,
                in_test: raw.in_test,
                reexport: raw.reexport,
                inline_child,
            });
        }
        (refs, errors)
    }

    /// The file module a path names: the longest prefix that is a file.
    pub(crate) fn file_of(&self, path: &[String]) -> Option<Vec<String>> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.file_modules.contains(p))
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
