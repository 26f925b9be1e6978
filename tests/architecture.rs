//! The architecture test: the layering table in `docs/design.md` is the single statement of which
//! room (top-level module of `src/`) may import which; this test reads that table and every file
//! under `src/`, and fails on an import the table forbids, on a room the table does not know, and
//! on a circle. The binary's `src/cli/` is not a library room: it can reach the library only through
//! its public API (`tq::…`), which the compiler already enforces.
//!
//! Inside a room: no file's non-test part is over [`MAX_LINES`] lines (a file splits by job before
//! it gets there), and the room's files have no circle among them ([`room_circles`], whose doc
//! states the rule; `docs/design.md` states it too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- layers:begin -->";
const END: &str = "<!-- layers:end -->";

/// room → rooms it may use, from the marked table of `design.md` (`| room | job | may use |`).
fn read_table(design: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let a = design
        .find(BEGIN)
        .ok_or("docs/design.md: no layers:begin marker")?;
    let b = design
        .find(END)
        .ok_or("docs/design.md: no layers:end marker")?;
    let mut table = BTreeMap::new();
    for line in design[a + BEGIN.len()..b].lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() < 3 || cells[0] == "room" || cells[0].starts_with("---") {
            continue;
        }
        let room = cells[0].trim_matches('`').to_string();
        let uses = cells[cells.len() - 1]
            .split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "—" && s != "-")
            .collect();
        table.insert(room, uses);
    }
    if table.is_empty() {
        return Err("docs/design.md: the layering table is empty".into());
    }
    Ok(table)
}

/// Source text without comments (doc comments mention other rooms in links) and without the
/// contents of string literals.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            // A string literal (not the char literal '"'): skip to its closing quote.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The rooms a file refers to through `crate::room`, `use crate::{room, …}` and `super::` chains
/// that climb out of its own room.
fn referenced_rooms(file_module: &[String], src: &str) -> BTreeSet<String> {
    let s = strip(src);
    let mut rooms = BTreeSet::new();
    let mut rest = s.as_str();
    while let Some(p) = rest.find("crate::") {
        let before = rest[..p].chars().next_back();
        let after = &rest[p + "crate::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue; // e.g. `$crate::` or an identifier ending in "crate"
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if item_start && depth == 1 && !c.is_whitespace() => {
                        item_start = false;
                        let id = ident_at(&group[k..]);
                        if !id.is_empty() && id != "self" {
                            rooms.insert(id.to_string());
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let id = ident_at(after);
            if !id.is_empty() {
                rooms.insert(id.to_string());
            }
        }
    }
    // `super::super::x` from src/a/b.rs reaches the crate root and names room `x`.
    let mut rest = s.as_str();
    while let Some(p) = rest.find("super::") {
        let mut depth = 0;
        let mut t = &rest[p..];
        while let Some(n) = t.strip_prefix("super::") {
            depth += 1;
            t = n;
        }
        rest = t;
        if depth >= file_module.len() {
            let id = ident_at(t);
            if !id.is_empty() {
                rooms.insert(id.to_string());
            }
        }
    }
    rooms
}

/// A file's module path (`src/a/b.rs` → [a, b]; `src/a/mod.rs` → [a]).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

#[derive(Debug)]
struct Violation(String);

/// Check `files` (path relative to `src/`, contents) against `table`.
fn check(
    table: &BTreeMap<String, BTreeSet<String>>,
    files: &[(PathBuf, String)],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, src) in files {
        let module = module_path(rel);
        let Some(room) = module.first().cloned() else {
            continue;
        };
        if room == "lib" || room == "main" || room == "cli" {
            continue; // the crate roots and the binary's CLI
        }
        let Some(allowed) = table.get(&room) else {
            out.push(Violation(format!(
                "src/{}: room '{room}' is not in the layering table of docs/design.md",
                rel.display()
            )));
            continue;
        };
        for used in referenced_rooms(&module, src) {
            if used == room || !table.contains_key(&used) && !files_have_room(files, &used) {
                continue; // own room, or not a room (e.g. `crate::Result` re-exported by lib.rs)
            }
            graph.entry(room.clone()).or_default().insert(used.clone());
            if !allowed.contains(&used) {
                out.push(Violation(format!(
                    "src/{}: room '{room}' imports '{used}', which the layering table does not allow",
                    rel.display()
                )));
            }
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        out.push(Violation(format!("import circle: {}", cycle.join(" → "))));
    }
    if let Some(cycle) = find_cycle(table) {
        out.push(Violation(format!(
            "the layering table has a circle: {}",
            cycle.join(" → ")
        )));
    }
    out
}

fn files_have_room(files: &[(PathBuf, String)], room: &str) -> bool {
    files
        .iter()
        .any(|(p, _)| module_path(p).first().is_some_and(|r| r == room))
}

fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = stack.iter().position(|s| s == n).unwrap_or(0);
                let mut c = stack[at..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn source_files() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_path_buf();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out
}

fn table() -> BTreeMap<String, BTreeSet<String>> {
    let design =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md"))
            .unwrap();
    read_table(&design).unwrap()
}

#[test]
fn src_follows_the_layering_table() {
    let files = source_files();
    assert!(files.len() > 50, "read {} files under src/", files.len());
    let v = check(&table(), &files);
    assert!(
        v.is_empty(),
        "layering violations:\n{}",
        v.iter()
            .map(|v| v.0.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn every_room_in_src_is_in_the_table_and_vice_versa() {
    let t = table();
    let files = source_files();
    let rooms: BTreeSet<String> = files
        .iter()
        .filter_map(|(p, _)| module_path(p).first().cloned())
        .filter(|r| !["lib", "main", "cli"].contains(&r.as_str()))
        .collect();
    let listed: BTreeSet<String> = t.keys().cloned().collect();
    assert_eq!(
        rooms, listed,
        "rooms in src/ vs rooms in the layering table"
    );
    for (room, uses) in &t {
        for u in uses {
            assert!(
                t.contains_key(u),
                "{room} may use '{u}', which is not a room"
            );
        }
    }
}

/// The back-up imports issue 12 found on main, each re-introduced into today's tree, must fail.
#[test]
fn upward_imports_and_circles_are_caught() {
    let t = table();
    let base = source_files();
    let cases: &[(&str, &str, &str)] = &[
        (
            "plan/mod.rs",
            "use crate::calib::run::Options;\n",
            "room 'plan' imports 'calib'",
        ),
        (
            "quant/ldlq/stock.rs",
            "fn f(_: &crate::calib::run::Options) {}\n",
            "room 'quant' imports 'calib'",
        ),
        (
            "calib/sequential.rs",
            "use crate::convert::{self, Stats};\n",
            "room 'calib' imports 'convert'",
        ),
        (
            "model/layer.rs",
            "use crate::eval::Windows;\n",
            "room 'model' imports 'eval'",
        ),
        (
            "gpu/mod.rs",
            "use crate::{error::Error, model::kv};\n",
            "room 'gpu' imports 'model'",
        ),
        (
            "gguf/reader.rs",
            "use crate::source::SourceTensor;\n",
            "room 'gguf' imports 'source'",
        ),
        (
            "source/hf/vocab.rs",
            "fn f() { super::super::super::tokenizer::x() }\n",
            "room 'source' imports 'tokenizer'",
        ),
    ];
    for (file, line, want) in cases {
        let mut files = base.clone();
        let f = files
            .iter_mut()
            .find(|(p, _)| p == Path::new(file))
            .unwrap_or_else(|| panic!("src/{file} missing"));
        f.1.push_str(line);
        let v = check(&t, &files);
        assert!(
            v.iter().any(|v| v.0.contains(want)),
            "{file} + {line:?}: expected '{want}', got {v:?}"
        );
    }
    // A circle is reported as such, even when the table itself (wrongly) allows both directions.
    let mut loose = t.clone();
    loose.get_mut("types").unwrap().insert("gguf".into());
    let mut files = base.clone();
    files
        .iter_mut()
        .find(|(p, _)| p == Path::new("types/mod.rs"))
        .unwrap()
        .1
        .push_str("use crate::gguf::Value;\n");
    let v = check(&loose, &files);
    assert!(v.iter().any(|v| v.0.starts_with("import circle")), "{v:?}");
    assert!(
        v.iter()
            .any(|v| v.0.starts_with("the layering table has a circle")),
        "{v:?}"
    );
    // Comments and strings do not count.
    let mut files = base.clone();
    files
        .iter_mut()
        .find(|(p, _)| p == Path::new("types/mod.rs"))
        .unwrap()
        .1
        .push_str(
            "/// see [`crate::convert`]\nconst S: &str = \"crate::calib\"; /* crate::model */\n",
        );
    assert!(check(&t, &files).is_empty());
}

#[test]
fn the_parser_reads_groups_and_super_chains() {
    let m = |s: &str| module_path(Path::new(s));
    let r = referenced_rooms(
        &m("a/b.rs"),
        "use crate::{x::Y, z, self};\nuse crate::{\n  w::{p, q},\n};\nsuper::super::v::f();",
    );
    assert_eq!(
        r,
        ["v", "w", "x", "z"].iter().map(|s| s.to_string()).collect()
    );
    let r = referenced_rooms(
        &m("a/mod.rs"),
        "super::k::f(); $crate::no; let c = '\"'; crate::yes",
    );
    assert_eq!(r, ["k", "yes"].iter().map(|s| s.to_string()).collect());
}

// ---------------------------------------------------------------------------------------------
// File length: a file's non-test part stays within `MAX_LINES`.

/// The most lines a file under `src/` may have before its test module.
const MAX_LINES: usize = 800;

/// Files over [`MAX_LINES`] today that another room is splitting; the list only shrinks.
const LONG_FILES_BEING_SPLIT: &[&str] = &[];

/// Lines of a file's non-test part: those before its first top-level `#[cfg(test)]` on a module
/// with a body (`mod tests {`, other attributes and comments may sit between them); a file with
/// no such module counts whole. `#[cfg(test)]` on a function or a `mod x;` does not end it.
fn non_test_lines(src: &str) -> usize {
    let lines: Vec<&str> = src.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_end() != "#[cfg(test)]" {
            continue;
        }
        let next = lines[i + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.is_empty() && !l.starts_with("#[") && !l.starts_with("//"));
        let item = next.map_or("", |n| {
            n.trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ")
        });
        if item.starts_with("mod ") && item.ends_with('{') {
            return i;
        }
    }
    lines.len()
}

/// `src/…` files whose non-test part is over [`MAX_LINES`], and stale entries of `allowed`.
fn long_files(files: &[(PathBuf, String)], allowed: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, src) in files {
        let n = non_test_lines(src);
        let name = rel.to_string_lossy().replace('\\', "/");
        let listed = allowed.contains(&name.as_str());
        if n > MAX_LINES && !listed {
            out.push(format!(
                "src/{name}: {n} lines before its tests (at most {MAX_LINES}): split it by job"
            ));
        } else if n <= MAX_LINES && listed {
            out.push(format!(
                "src/{name}: {n} lines now, within {MAX_LINES}: remove it from LONG_FILES_BEING_SPLIT"
            ));
        }
    }
    for a in allowed {
        if !files.iter().any(|(p, _)| p == Path::new(a)) {
            out.push(format!(
                "src/{a} no longer exists: remove it from LONG_FILES_BEING_SPLIT"
            ));
        }
    }
    out
}

#[test]
fn no_file_is_over_800_lines_before_its_tests() {
    let v = long_files(&source_files(), LONG_FILES_BEING_SPLIT);
    assert!(v.is_empty(), "files too long:\n{}", v.join("\n"));
}

#[test]
fn the_line_count_stops_at_the_test_module() {
    let body = "fn f() {}\n".repeat(MAX_LINES);
    let tests = "#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";
    assert_eq!(non_test_lines(&format!("{body}{tests}")), MAX_LINES);
    // A test-only function or an out-of-line test module is part of the count.
    let src = format!("#[cfg(test)]\nfn helper() {{}}\n#[cfg(test)]\nmod tests;\n{body}");
    assert_eq!(non_test_lines(&src), MAX_LINES + 4);
    // Attributes and comments between `#[cfg(test)]` and the module do not hide it.
    let src = format!(
        "{body}#[cfg(test)]\n#[allow(dead_code)]\n// helpers\npub(crate) mod tests {{\n}}\n"
    );
    assert_eq!(non_test_lines(&src), MAX_LINES);
    let one_over = |name: &str| vec![(PathBuf::from(name), format!("{body}fn g() {{}}\n{tests}"))];
    let v = long_files(&one_over("quant/x.rs"), &[]);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("src/quant/x.rs: 801 lines"), "{v:?}");
    assert!(long_files(&one_over("convert.rs"), &["convert.rs"]).is_empty());
    // A listed file that got short, or is gone, is reported so that the list shrinks.
    let short = vec![(PathBuf::from("convert.rs"), body.clone())];
    assert!(long_files(&short, &["convert.rs"])[0].contains("remove it"));
    assert!(long_files(&short, &["cli/convert.rs"])[0].contains("no longer exists"));
}

// ---------------------------------------------------------------------------------------------
// Circles inside a room.
//
// The rule (also in docs/design.md, "Layers"): the files of one room form a graph, an edge from
// file A to file B when A names B by path — `crate::room::…`, `super::…`, `self::…`, in a `use`
// or in code, or a path that starts with a name A imported from the room — resolved from the
// module A's code sits in (inline `mod tests { … }` included) to the deepest file module named. A
// name a module re-exports (`pub use child::Item`, any `use` in that module) is seen through: a
// path to `room::Item` is an edge to the file that defines it. A module's edges into its own
// subtree are dispatch (a `mod.rs`, or `a.rs` with an `a/` folder, calling its children) and do
// not count; everything else does, test code included. The graph must have no circle: files do
// not use each other both ways, directly or around a longer loop, and a re-export does not hide
// one (`a.rs` using `super::X` that `mod.rs` re-exports from `b.rs` is an edge to `b.rs`). A
// child using an item its parent *defines* (the room's shared types, helpers, the dispatch
// functions themselves) is an edge to the parent's file, which has no edges back into its own
// subtree: that is the dispatch the rule allows.

/// A path a file names, and the module its code sits in.
#[derive(Debug, Clone)]
struct PathRef {
    /// The module path of the code that names it (`[room, …, inline modules]`).
    ctx: Vec<String>,
    /// The path's segments as written (`crate`, `super`, `self` or a name first).
    segs: Vec<String>,
}

/// One `use` item: the path it imports and the name it binds (`None` for a glob).
#[derive(Debug, Clone)]
struct UseItem {
    ctx: Vec<String>,
    segs: Vec<String>,
    name: Option<String>,
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Expand a use tree (`a::b::{c, d::e as f, self, *}`) into its items.
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    // Split at top-level commas.
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let mut segs = prefix.to_vec();
        let mut rest = part.trim_start_matches("::");
        loop {
            let rest_t = rest.trim_start();
            if let Some(group) = rest_t.strip_prefix('{') {
                let inner = group.trim_end().strip_suffix('}').unwrap_or(group);
                expand_use(inner, &segs, out);
                break;
            }
            if rest_t.starts_with('*') {
                out.push((segs.clone(), None));
                break;
            }
            let id = ident_at(rest_t);
            if id.is_empty() {
                break;
            }
            let after = rest_t[id.len()..].trim_start();
            if let Some(next) = after.strip_prefix("::") {
                segs.push(id.to_string());
                rest = next;
                continue;
            }
            // Last segment, maybe `as alias`.
            let alias = after
                .strip_prefix("as")
                .map(|a| ident_at(a.trim_start()).to_string());
            if id == "self" {
                let name = alias.or_else(|| segs.last().cloned());
                out.push((segs.clone(), name));
            } else {
                segs.push(id.to_string());
                out.push((segs.clone(), Some(alias.unwrap_or_else(|| id.to_string()))));
            }
            break;
        }
    }
}

/// The paths and `use` items of one file (comments and strings stripped first), each with the
/// module its code sits in: `module` is the file's module path, extended by inline modules.
fn scan_paths(module: &[String], src: &str) -> (Vec<PathRef>, Vec<UseItem>) {
    let s = strip(src);
    let b = s.as_bytes();
    let (mut refs, mut uses) = (Vec::new(), Vec::new());
    // Inline modules: (name, brace depth inside its body).
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let ctx = |stack: &[(String, usize)]| {
        let mut c = module.to_vec();
        c.extend(stack.iter().map(|(n, _)| n.clone()));
        c
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\'' {
            // A char literal ('x', '\n', '{'); else a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                i += 1;
            }
            continue;
        }
        if c == b'{' {
            depth += 1;
            i += 1;
            continue;
        }
        if c == b'}' {
            depth = depth.saturating_sub(1);
            while stack.last().is_some_and(|(_, d)| depth < *d) {
                stack.pop();
            }
            i += 1;
            continue;
        }
        if !is_ident_byte(c) || (i > 0 && (is_ident_byte(b[i - 1]) || b[i - 1] == b'$')) {
            i += 1;
            continue;
        }
        let id = ident_at(&s[i..]);
        let after = &s[i + id.len()..];
        if id == "mod" {
            let name = ident_at(after.trim_start());
            let tail = after.trim_start()[name.len()..].trim_start();
            if !name.is_empty() && tail.starts_with('{') {
                stack.push((name.to_string(), depth + 1));
            }
            i += id.len();
            continue;
        }
        if id == "use" && after.starts_with(|c: char| c.is_whitespace() || c == ':') {
            let end = after.find(';').unwrap_or(after.len());
            let mut items = Vec::new();
            expand_use(&after[..end], &[], &mut items);
            let cx = ctx(&stack);
            for (segs, name) in items {
                uses.push(UseItem {
                    ctx: cx.clone(),
                    segs,
                    name,
                });
            }
            i += id.len() + end;
            continue;
        }
        // A path: `id::id::…` not preceded by `::` (the middle of another path).
        let preceded = s[..i].trim_end().ends_with("::");
        if !preceded && after.starts_with("::") {
            let mut segs = vec![id.to_string()];
            let mut rest = &after[2..];
            loop {
                let n = ident_at(rest);
                if n.is_empty() {
                    break;
                }
                segs.push(n.to_string());
                match rest[n.len()..].strip_prefix("::") {
                    Some(r) => rest = r,
                    None => break,
                }
            }
            refs.push(PathRef {
                ctx: ctx(&stack),
                segs,
            });
            i = s.len() - rest.len();
            continue;
        }
        i += id.len();
    }
    (refs, uses)
}

/// Circles among the files of each room, each as `a.rs → b.rs → a.rs`, with the path that made
/// each edge.
fn room_circles(files: &[(PathBuf, String)]) -> Vec<String> {
    // Modules: file modules (path → file index) and inline modules (path → file index).
    let mut module_file: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    let mut file_modules = Vec::new();
    let mut scans = Vec::new();
    for (k, (rel, src)) in files.iter().enumerate() {
        let m = module_path(rel);
        module_file.insert(m.clone(), k);
        file_modules.push(m.clone());
        scans.push(scan_paths(&m, src));
    }
    // Inline modules (`mod tests { … }`) belong to their file.
    for (k, (refs, uses)) in scans.iter().enumerate() {
        for c in refs
            .iter()
            .map(|r| &r.ctx)
            .chain(uses.iter().map(|u| &u.ctx))
        {
            module_file.entry(c.clone()).or_insert(k);
        }
    }
    // Where a path written in `ctx` points, absolute (`None`: another crate, or a local name).
    let absolute = |ctx: &[String],
                    segs: &[String],
                    imports: &BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>|
     -> Option<Vec<String>> {
        let first = segs.first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => ctx.to_vec(),
            "super" => {
                let mut b = ctx.to_vec();
                let mut k = 0;
                while segs.get(k).is_some_and(|s| s == "super") {
                    b.pop()?;
                    k += 1;
                }
                b.extend(segs[k..].iter().cloned());
                return Some(b);
            }
            name => {
                let mut child = ctx.to_vec();
                child.push(name.to_string());
                if module_file.contains_key(&child) {
                    ctx.to_vec()
                } else if let Some(t) = imports.get(ctx).and_then(|m| m.get(name)) {
                    let mut b = t.clone();
                    b.extend(segs[1..].iter().cloned());
                    return Some(b);
                } else {
                    return None;
                }
            }
        };
        let skip = usize::from(first == "crate" || first == "self");
        base.extend(segs[skip..].iter().cloned());
        Some(base)
    };
    // Every module's imports: name → absolute path (local ones only).
    let mut imports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (_, uses) in &scans {
        for u in uses {
            let Some(name) = &u.name else { continue };
            let empty = BTreeMap::new();
            if let Some(t) = absolute(&u.ctx, &u.segs, &empty) {
                imports
                    .entry(u.ctx.clone())
                    .or_default()
                    .insert(name.clone(), t);
            }
        }
    }
    // The file a path (absolute) lands in, seeing through re-exports.
    let land = |mut p: Vec<String>| -> Option<usize> {
        for _ in 0..8 {
            let (m, k) = (0..=p.len())
                .rev()
                .find_map(|n| module_file.get(&p[..n]).map(|&k| (n, k)))?;
            let next = p.get(m).and_then(|name| imports.get(&p[..m])?.get(name));
            match next {
                Some(t) => {
                    let mut q = t.clone();
                    q.extend(p[m + 1..].iter().cloned());
                    p = q;
                }
                None => return Some(k),
            }
        }
        None
    };
    // The graph: file → file → an example path.
    let mut graph: BTreeMap<usize, BTreeMap<usize, String>> = BTreeMap::new();
    for (a, (refs, uses)) in scans.iter().enumerate() {
        let ma = &file_modules[a];
        let Some(room) = ma.first() else { continue };
        if ma.len() == 1 && (room == "lib" || room == "main") {
            continue;
        }
        let all = refs
            .iter()
            .map(|r| (&r.ctx, &r.segs))
            .chain(uses.iter().map(|u| (&u.ctx, &u.segs)));
        for (ctx, segs) in all {
            let Some(p) = absolute(ctx, segs, &imports) else {
                continue;
            };
            if p.first() != Some(room) {
                continue;
            }
            let Some(bk) = land(p) else { continue };
            let mb = &file_modules[bk];
            if bk == a || mb.starts_with(ma) {
                continue; // itself, or dispatch into its own subtree
            }
            graph
                .entry(a)
                .or_default()
                .entry(bk)
                .or_insert_with(|| segs.join("::"));
        }
    }
    // Circles, one at a time: each found is named, its files taken out, and the rest searched.
    let names: Vec<String> = files
        .iter()
        .map(|(p, _)| p.to_string_lossy().replace('\\', "/"))
        .collect();
    let plain: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(a, m)| (a.to_string(), m.keys().map(|b| b.to_string()).collect()))
        .collect();
    let mut out = Vec::new();
    let mut cut = plain.clone();
    while let Some(cycle) = find_cycle(&cut) {
        let ids: Vec<usize> = cycle.iter().map(|s| s.parse().unwrap()).collect();
        let steps: Vec<String> = ids
            .windows(2)
            .map(|w| format!("src/{} → ({})", names[w[0]], graph[&w[0]][&w[1]]))
            .collect();
        out.push(format!("circle: {} src/{}", steps.join(" "), names[ids[0]]));
        // Take the component's nodes out and look for more.
        for n in &cycle {
            cut.remove(n);
        }
        for v in cut.values_mut() {
            for n in &cycle {
                v.remove(n);
            }
        }
    }
    out
}

/// Circles on main when the check came (by their files), reported to the rooms that own them;
/// the list only shrinks.
const KNOWN_CIRCLES: &[&[&str]] = &[
    // source room (reported to the lead): spm.rs builds the vocabulary with vocab.rs's helpers,
    // vocab.rs dispatches to spm.rs.
    &["source/hf/spm.rs", "source/hf/vocab.rs"],
];

/// The circles of `found` not in `known`, and the entries of `known` no longer found.
fn new_circles(found: &[String], known: &[&[&str]]) -> Vec<String> {
    let files_of = |c: &str| -> BTreeSet<String> {
        c.split_whitespace()
            .filter_map(|w| w.strip_prefix("src/"))
            .map(str::to_string)
            .collect()
    };
    let known: Vec<BTreeSet<String>> = known
        .iter()
        .map(|k| k.iter().map(|s| s.to_string()).collect())
        .collect();
    let mut out: Vec<String> = found
        .iter()
        .filter(|c| !known.contains(&files_of(c)))
        .cloned()
        .collect();
    for k in &known {
        if !found.iter().any(|c| &files_of(c) == k) {
            out.push(format!(
                "the circle among {k:?} is gone: remove it from KNOWN_CIRCLES"
            ));
        }
    }
    out
}

#[test]
fn no_circle_inside_a_room() {
    let v = new_circles(&room_circles(&source_files()), KNOWN_CIRCLES);
    assert!(v.is_empty(), "circles inside rooms:\n{}", v.join("\n"));
}

/// The checker on synthetic rooms: direct circles, circles through a parent's re-export or
/// through test code are found; dispatch from a `mod.rs` to its children and children using
/// their parent's own items are not circles.
#[test]
fn room_circles_are_caught() {
    let room = |fs: &[(&str, &str)]| -> Vec<(PathBuf, String)> {
        fs.iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect()
    };
    // Siblings using each other.
    let v = room_circles(&room(&[
        ("r/mod.rs", "mod a;\nmod b;\n"),
        ("r/a.rs", "use crate::r::b::B;\npub struct A;\n"),
        ("r/b.rs", "pub struct B;\nfn f() { super::a::g() }\n"),
    ]));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("src/r/a.rs → (crate::r::b::B) src/r/b.rs"),
        "{v:?}"
    );
    assert!(
        v[0].contains("src/r/b.rs → (super::a::g) src/r/a.rs"),
        "{v:?}"
    );
    // Through the parent's re-export, and from a test module.
    let v = room_circles(&room(&[
        (
            "r/mod.rs",
            "mod a;\nmod b;\npub use self::a::{A, Other as O};\n",
        ),
        (
            "r/a.rs",
            "pub struct A;\n#[cfg(test)]\nmod tests {\n    use super::super::b::B;\n}\n",
        ),
        ("r/b.rs", "use super::O;\npub struct B;\n"),
    ]));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].contains("(super::O) src/r/a.rs"), "{v:?}");
    assert!(v[0].contains("(super::super::b::B) src/r/b.rs"), "{v:?}");
    // A name imported from a sibling module, used by path later.
    let v = room_circles(&room(&[
        ("r/mod.rs", "mod a;\nmod b;\n"),
        ("r/a.rs", "use super::b;\nfn f() { b::g() }\n"),
        ("r/b.rs", "fn g() { crate::r::a::f() }\n"),
    ]));
    assert_eq!(v.len(), 1, "{v:?}");
    // Dispatch: the parent uses its children, the children use the parent's own items and each
    // other one way; a nested folder's mod.rs dispatches to its own children too.
    let v = room_circles(&room(&[
        ("r/mod.rs", "mod a;\nmod b;\nmod c;\npub struct Shared;\npub use a::A;\nfn f() { a::g(); b::h(); c::k::x(); }\n"),
        ("r/a.rs", "use super::{b::B, Shared};\nmod tests {\n    use super::*;\n    use crate::r::A;\n}\n"),
        ("r/b.rs", "use super::Shared;\nuse crate::other::Thing;\nuse std::fmt;\n"),
        ("r/c/mod.rs", "mod k;\nuse self::k::K;\nuse super::a::A;\n"),
        ("r/c/k.rs", "use super::super::Shared;\nconst C: char = '}';\n"),
    ]));
    assert!(v.is_empty(), "{v:?}");
    // The allowance is by the circle's files, and a fixed circle must leave the list.
    let c = vec!["circle: src/r/a.rs → (x) src/r/b.rs → (y) src/r/a.rs".to_string()];
    assert!(new_circles(&c, &[&["r/b.rs", "r/a.rs"]]).is_empty());
    assert_eq!(new_circles(&c, &[&["r/a.rs", "r/c.rs"]]).len(), 2);
    assert!(new_circles(&[], &[&["r/a.rs", "r/b.rs"]])[0].contains("is gone"));
    // The real tree with a circle added: psp.rs is below trellis.rs; factor.rs below tq.rs.
    let base = source_files();
    for (file, line, want) in [
        (
            "quant/ldlq/psp.rs",
            "use super::trellis::TrellisInner;\n",
            "src/quant/ldlq/psp.rs → (super::trellis::TrellisInner) src/quant/ldlq/trellis.rs",
        ),
        (
            "quant/ldlq/factor.rs",
            "fn f() { crate::quant::ldlq::tq::quantize_rows() }\n",
            "src/quant/ldlq/factor.rs → (crate::quant::ldlq::tq::quantize_rows) src/quant/ldlq/tq.rs",
        ),
    ] {
        let mut files = base.clone();
        files
            .iter_mut()
            .find(|(p, _)| p == Path::new(file))
            .unwrap_or_else(|| panic!("src/{file} missing"))
            .1
            .push_str(line);
        let v = room_circles(&files);
        assert!(v.iter().any(|c| c.contains(want)), "{file} + {line:?}: {v:?}");
    }
}
