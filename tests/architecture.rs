//! The architecture test: the layering table in `docs/design.md` is the single statement of which
//! room (top-level module of `src/`) may import which; this test reads that table and every file
//! under `src/`, and fails on an import the table forbids, on a room the table does not know, and
//! on a circle. The binary's `src/cli/` is not a library room: it can reach the library only through
//! its public API (`tq::…`), which the compiler already enforces.

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
            "quant/ldlq.rs",
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
