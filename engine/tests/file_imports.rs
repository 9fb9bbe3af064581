//! ARCHITECTURE.md states that inside a crate no two files import each other, directly or in
//! a loop, except a `lib.rs` or `mod.rs` (or a `name.rs` beside its `name/` folder) with the
//! files beneath it. This test reads every workspace crate's sources and holds the code to it.
//!
//! A file imports another when it names a path into it: `crate::a::b::Name` or
//! `super::Name`, in a `use` (groups like `crate::{a::X, b::Y}` expanded) or inline. Each path
//! goes to the file of its longest prefix that is a module. A file's own unit-test module is
//! left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates, by folder (each has its sources in `src/`).
const CRATES: &[&str] = &[
    "storage",
    "consensus",
    "plugins",
    "plugins/guest/abi",
    "plugins/guest/session-logic",
    "engine",
    "http-api",
    "benches",
];

/// A module path inside a crate: `[]` for the crate's root.
type Module = Vec<String>;

#[test]
fn no_two_files_of_a_crate_import_each_other_in_a_loop() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut loops = Vec::new();
    for folder in CRATES {
        let sources = read_sources(&workspace.join(folder).join("src"));
        assert!(!sources.is_empty(), "no sources found in {folder}/src");
        for found in import_loops(&sources) {
            loops.push(format!("{folder}/src: {}", found.join(" -> ")));
        }
    }
    assert!(
        loops.is_empty(),
        "files that import each other in a loop:\n{}",
        loops.join("\n")
    );
}

#[test]
fn a_loop_through_grouped_inline_and_parent_paths_is_found() {
    let sources = sources_of(&[
        ("lib.rs", "mod a; mod b; mod m;\npub use a::A;"),
        ("a.rs", "use crate::{b::B, A};\npub struct A;"),
        ("b.rs", "pub struct B;\nfn f() { crate::m::x::go(); }"),
        ("m/mod.rs", "mod x; mod y; pub use x::go;"),
        ("m/x.rs", "use super::y::Y;\npub fn go() {}"),
        // The loop closes here: y → a → b → x → y.
        (
            "m/y.rs",
            "// crate::b is a comment\npub struct Y(crate::a::A);",
        ),
    ]);
    assert_eq!(
        import_loops(&sources),
        vec![vec!["a.rs", "b.rs", "m/x.rs", "m/y.rs"]]
    );
}

#[test]
fn a_folder_module_and_the_files_beneath_it_and_test_modules_are_no_loop() {
    let sources = sources_of(&[
        ("lib.rs", "mod m; mod n; use m::x::X;"),
        (
            "m/mod.rs",
            "mod x; pub use self::x::X; use crate::m::x::helper;",
        ),
        ("m/x.rs", "use super::X as Again;\npub struct X;"),
        ("n.rs", "mod inner;\nuse crate::n::inner::I;"),
        ("n/inner.rs", "use super::super::m::X;\npub struct I;"),
        (
            "other.rs",
            "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::n::inner::I;\n}",
        ),
        ("m/z.rs", "use crate::other::f;"),
    ]);
    assert_eq!(import_loops(&sources), Vec::<Vec<String>>::new());
}

/// Every `.rs` file under `src` (binaries in `src/bin/` are crates of their own: left out),
/// by path relative to `src`.
fn read_sources(src: &Path) -> BTreeMap<PathBuf, String> {
    let mut sources = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|error| panic!("reading {}: {error}", folder.display()));
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            let relative = path.strip_prefix(src).expect("beneath src").to_path_buf();
            if path.is_dir() && relative != Path::new("bin") {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
                sources.insert(relative, text);
            }
        }
    }
    sources
}

fn sources_of(files: &[(&str, &str)]) -> BTreeMap<PathBuf, String> {
    (files.iter())
        .map(|&(path, text)| (PathBuf::from(path), text.to_string()))
        .collect()
}

/// The loops among the files' imports, each as its files in path order.
fn import_loops(sources: &BTreeMap<PathBuf, String>) -> Vec<Vec<String>> {
    let modules: BTreeMap<Module, &PathBuf> =
        sources.keys().map(|path| (module_of(path), path)).collect();
    let mut imports: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for (path, text) in sources {
        let importer = module_of(path);
        let targets = imports.entry(path).or_default();
        for (root, segments) in paths_in(&without_tests(text)) {
            let Some(target) = resolve(&importer, &root, &segments, &modules) else {
                continue;
            };
            // A module's own file and the files beneath it may import each other.
            let target_module = module_of(target);
            if !target_module.starts_with(&importer) && !importer.starts_with(&target_module) {
                targets.insert(target);
            }
        }
    }
    strongly_connected(&imports)
        .into_iter()
        .filter(|files| files.len() > 1)
        .map(|files| {
            let mut names: Vec<String> = files
                .iter()
                .map(|path| path.to_string_lossy().replace('\\', "/"))
                .collect();
            names.sort();
            names
        })
        .collect()
}

/// `a/b.rs` → `[a, b]`; `a/mod.rs` → `[a]`; `lib.rs` and `main.rs` → `[]`.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    let stem = file.trim_end_matches(".rs");
    let root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        parts.push(stem.to_string());
    }
    parts
}

/// `text` without line comments and without its unit-test module (`#[cfg(test)] mod name {`
/// to the end of the file, where such modules sit).
fn without_tests(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let next = next.trim();
                next.starts_with("mod ") && next.ends_with('{')
            })
        {
            break;
        }
        kept.push_str(line.split("//").next().unwrap_or(""));
        kept.push('\n');
    }
    kept
}

/// Every path in `code` that starts at `crate::` or `super::`: its root and its segments, a
/// group `{a, b::c}` giving one path per member.
fn paths_in(code: &str) -> Vec<(String, Vec<String>)> {
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    for root in ["crate", "super"] {
        let start_of = |at: usize| at == 0 || (!is_ident(bytes[at - 1]) && bytes[at - 1] != b':');
        let pattern = format!("{root}::");
        let mut from = 0;
        while let Some(found) = code[from..].find(&pattern) {
            let at = from + found;
            from = at + pattern.len();
            if start_of(at) {
                let mut cursor = from;
                parse_tree(bytes, &mut cursor, Vec::new(), &mut |segments| {
                    paths.push((root.to_string(), segments))
                });
            }
        }
    }
    paths
}

/// Reads one use-tree at `cursor` (segments joined by `::`, ending at a name, `*` or a
/// group), giving `prefix` plus each path it names to `found`.
fn parse_tree(
    bytes: &[u8],
    cursor: &mut usize,
    mut prefix: Vec<String>,
    found: &mut dyn FnMut(Vec<String>),
) {
    loop {
        skip_spaces(bytes, cursor);
        if bytes.get(*cursor) == Some(&b'{') {
            *cursor += 1;
            loop {
                skip_spaces(bytes, cursor);
                match bytes.get(*cursor) {
                    None => return,
                    Some(b'}') => {
                        *cursor += 1;
                        return;
                    }
                    Some(b',') => *cursor += 1,
                    Some(_) => {
                        let before = *cursor;
                        parse_tree(bytes, cursor, prefix.clone(), found);
                        // `as name` and anything else not a path: step over it.
                        while *cursor < bytes.len() && !matches!(bytes[*cursor], b',' | b'}') {
                            *cursor += 1;
                        }
                        if *cursor == before {
                            *cursor += 1;
                        }
                    }
                }
            }
        }
        let start = *cursor;
        while bytes
            .get(*cursor)
            .is_some_and(|&b| is_ident(b) || b == b'*')
        {
            *cursor += 1;
        }
        if *cursor > start {
            prefix.push(String::from_utf8_lossy(&bytes[start..*cursor]).into_owned());
        }
        skip_spaces(bytes, cursor);
        if bytes[*cursor..].starts_with(b"::") && *cursor > start {
            *cursor += 2;
            continue;
        }
        found(prefix);
        return;
    }
}

fn skip_spaces(bytes: &[u8], cursor: &mut usize) {
    while bytes.get(*cursor).is_some_and(|b| b.is_ascii_whitespace()) {
        *cursor += 1;
    }
}

fn is_ident(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// The file a path written in module `importer` points into: that of its longest prefix that
/// is a module.
fn resolve<'a>(
    importer: &Module,
    root: &str,
    segments: &[String],
    modules: &BTreeMap<Module, &'a PathBuf>,
) -> Option<&'a PathBuf> {
    let mut full: Module = match root {
        "crate" => Vec::new(),
        _ => importer[..importer.len().checked_sub(1)?].to_vec(),
    };
    let mut rest = segments;
    while let Some((first, after)) = rest.split_first() {
        if first != "super" {
            break;
        }
        full.pop()?;
        rest = after;
    }
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .find_map(|length| modules.get(&full[..length]).copied())
}

/// The strongly connected components of `graph` (Tarjan's algorithm, iterative).
fn strongly_connected<'a>(
    graph: &BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>,
) -> Vec<Vec<&'a PathBuf>> {
    let nodes: Vec<&PathBuf> = graph.keys().copied().collect();
    let index_of: BTreeMap<&PathBuf, usize> =
        nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let edges: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            graph[n]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let mut order = vec![usize::MAX; nodes.len()];
    let mut low = vec![0; nodes.len()];
    let mut on_stack = vec![false; nodes.len()];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next_order = 0;
    for start in 0..nodes.len() {
        if order[start] != usize::MAX {
            continue;
        }
        // (node, next edge to look at)
        let mut calls = vec![(start, 0)];
        order[start] = next_order;
        low[start] = next_order;
        next_order += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&mut (node, ref mut edge)) = calls.last_mut() {
            if let Some(&target) = edges[node].get(*edge) {
                *edge += 1;
                if order[target] == usize::MAX {
                    order[target] = next_order;
                    low[target] = next_order;
                    next_order += 1;
                    stack.push(target);
                    on_stack[target] = true;
                    calls.push((target, 0));
                } else if on_stack[target] {
                    low[node] = low[node].min(order[target]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(nodes[member]);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}
