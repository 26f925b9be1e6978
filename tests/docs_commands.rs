//! The documentation is checked against the binary and against itself:
//!
//! - every subcommand of `tq` (found in `tq --help`, recursing into subcommands that have their
//!   own, such as `tq calib merge`) has a page `docs/commands/<command>.md`, and every long flag
//!   its `--help` lists (aliases included; `--help` and `--version` aside) is named on that page.
//!   A sub-subcommand is documented on `docs/commands/<command>-<sub>.md` when that page exists,
//!   else in a section of `docs/commands/<command>.md`. A page for no subcommand is an error too.
//! - the user documentation (README.md and every Markdown file under docs/ except the measurement
//!   notebook docs/bench/) names no issue numbers: a reader cannot follow "issue 16".
//! - every relative link in README.md and docs/ (notebook included) points to a file that exists,
//!   and a `#fragment` to a heading of that file.
//! - the indexes are complete: docs/README.md links every page directly under docs/ and every
//!   command page, docs/bench/README.md every page of the notebook.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tq"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run tq {} --help: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "tq {} --help: exit {:?}: {}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The names in the `Commands:` section of a help text (clap's layout: two-space indent, the
/// name, then its description), without `help`.
fn subcommands(help: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if line.trim().is_empty() || !line.starts_with("  ") {
            break;
        }
        let name = line.split_whitespace().next().unwrap_or("");
        if !name.is_empty() && name != "help" {
            names.push(name.to_string());
        }
    }
    names
}

/// Every long flag a help text defines: the option lines (`  -o, --output <OUTPUT>`,
/// `      --json`) and their visible aliases (`[aliases: --ctk, --kv-k]`). Flags named inside
/// descriptions (`as tq calib --tokens`) are not definitions and are not collected.
fn long_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let flag_at = |s: &str| -> Option<String> {
        let s = s.strip_prefix("--")?;
        let name: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        (!name.is_empty()).then(|| format!("--{name}"))
    };
    for line in help.lines() {
        let t = line.trim_start();
        if line.starts_with(' ') {
            // `-o, --output …` or `--json …`
            let b = t.as_bytes();
            let t = if b.len() > 4 && b[0] == b'-' && b[1] != b'-' && &b[2..4] == b", " {
                &t[4..]
            } else {
                t
            };
            if let Some(f) = flag_at(t) {
                flags.insert(f);
            }
        }
        for marker in ["[aliases: ", "[alias: "] {
            let mut rest = line;
            while let Some(i) = rest.find(marker) {
                rest = &rest[i + marker.len()..];
                let end = rest.find(']').unwrap_or(rest.len());
                for a in rest[..end].split(',') {
                    if let Some(f) = flag_at(a.trim()) {
                        flags.insert(f);
                    }
                }
                rest = &rest[end..];
            }
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    flags
}

/// Whether `page` names `flag` as a whole word (`--ref` is not found in `--ref-logits`).
fn names_flag(page: &str, flag: &str) -> bool {
    page.match_indices(flag).any(|(i, _)| {
        let next = page[i + flag.len()..].chars().next();
        !matches!(next, Some(c) if c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Every command path: `["inspect"]`, …, `["calib"]`, `["calib", "merge"]`, …
fn command_paths() -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut todo: Vec<Vec<String>> = subcommands(&help(&[]))
        .into_iter()
        .map(|c| vec![c])
        .collect();
    assert!(
        todo.len() >= 10,
        "tq --help lists only {todo:?}: has its layout changed?"
    );
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for sub in subcommands(&help(&args)) {
            let mut p = path.clone();
            p.push(sub);
            todo.push(p);
        }
        paths.push(path);
    }
    paths.sort();
    paths
}

#[test]
fn long_flags_are_read_from_help() {
    let h = "Options:\n  -o, --output <OUTPUT>  Out\n      --json  JSON (as `tq calib --tokens`)\n      \
             --cache-type-k <K>  K [default: f16] [aliases: --ctk, --kv-k]\n  -h, --help  Print help\n";
    let got: Vec<String> = long_flags(h).into_iter().collect();
    assert_eq!(
        got,
        ["--cache-type-k", "--ctk", "--json", "--kv-k", "--output"]
    );
    assert!(names_flag("use `--ref x`", "--ref"));
    assert!(!names_flag("use `--ref-logits x`", "--ref"));
    assert_eq!(
        subcommands("Commands:\n  merge  Sum\n  help   Print\n\nOptions:\n"),
        ["merge"]
    );
}

#[test]
fn every_subcommand_and_flag_is_documented() {
    let dir = root().join("docs/commands");
    let mut missing = Vec::new();
    let mut pages_used = BTreeSet::new();
    for path in command_paths() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let own = dir.join(format!("{}.md", path.join("-")));
        let top = dir.join(format!("{}.md", path[0]));
        let page = if own.exists() { own } else { top };
        let rel = page.strip_prefix(root()).unwrap().display().to_string();
        let Ok(text) = std::fs::read_to_string(&page) else {
            missing.push(format!("tq {}: no page {rel}", args.join(" ")));
            continue;
        };
        pages_used.insert(page.clone());
        let flags = long_flags(&help(&args));
        for f in flags {
            if !names_flag(&text, &f) {
                missing.push(format!("tq {} {f}: not in {rel}", args.join(" ")));
            }
        }
    }
    for e in std::fs::read_dir(&dir).expect("docs/commands/") {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".md") && name != "README.md" && !pages_used.contains(&p) {
            missing.push(format!(
                "docs/commands/{name}: a page for no subcommand of tq (renamed or removed?)"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "the command pages are out of date with `tq --help`:\n  {}",
        missing.join("\n  ")
    );
}

/// README.md and the Markdown under docs/, the notebook docs/bench/ included when `notebook`.
fn markdown_files(notebook: bool) -> Vec<PathBuf> {
    fn walk(dir: &Path, notebook: bool, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                if notebook || p.file_name().is_some_and(|n| n != "bench") {
                    walk(&p, notebook, out);
                }
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), notebook, &mut files);
    files
}

#[test]
fn user_docs_name_no_issue_numbers() {
    let re = regex::Regex::new(r"(?i)\bissues? #?\d+").unwrap();
    let mut hits = Vec::new();
    for f in markdown_files(false) {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(m) = re.find(line) {
                hits.push(format!(
                    "{}:{}: \"{}\"",
                    f.strip_prefix(root()).unwrap().display(),
                    n + 1,
                    m.as_str()
                ));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "user docs name issue numbers (say what the change is instead; the notebook \
         docs/bench/ is exempt):\n  {}",
        hits.join("\n  ")
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (`-` and `_` kept), spaces to
/// `-`; repeated headings get `-1`, `-2`, ….
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let mut slug = String::new();
        for c in title.chars() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                slug.extend(c.to_lowercase());
            } else if c == ' ' {
                slug.push('-');
            }
        }
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn relative_links_resolve() {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    for f in markdown_files(true) {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for c in link.captures_iter(line) {
                let target = &c[1];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, frag) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    f.clone()
                } else {
                    f.parent().unwrap().join(file)
                };
                if !path.exists() {
                    broken.push(format!("{rel}:{}: {target}: no such file", n + 1));
                    continue;
                }
                if !frag.is_empty() && path.extension().is_some_and(|x| x == "md") {
                    let t = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&t).contains(frag) {
                        broken.push(format!("{rel}:{}: {target}: no such heading", n + 1));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links in the docs:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn anchors_follow_github() {
    let a = anchors("# `tq convert` vs `llama-quantize`\n## tq2_r: the seed design's 2-bit (tq's own type)\n## A\n## A\n");
    for want in [
        "tq-convert-vs-llama-quantize",
        "tq2_r-the-seed-designs-2-bit-tqs-own-type",
        "a",
        "a-1",
    ] {
        assert!(a.contains(want), "{want} not in {a:?}");
    }
}

/// The relative link targets of a Markdown file, resolved against its directory.
fn linked_files(file: &Path) -> BTreeSet<PathBuf> {
    let link = regex::Regex::new(r"\]\(([^)\s#]+)(#[^)\s]*)?\)").unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    link.captures_iter(&text)
        .filter(|c| !c[1].contains("://"))
        .map(|c| normalize(&file.parent().unwrap().join(&c[1])))
        .collect()
}

/// `a/b/../c` → `a/c` (without touching the file system).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn md_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    v.sort();
    v
}

#[test]
fn indexes_link_every_page() {
    let docs = root().join("docs");
    let mut unlisted = Vec::new();
    let index = docs.join("README.md");
    let linked = linked_files(&index);
    let pages = md_in(&docs)
        .into_iter()
        .chain(md_in(&docs.join("commands")))
        .chain([docs.join("bench/README.md")]);
    for p in pages {
        if p != index && !linked.contains(&normalize(&p)) {
            unlisted.push(format!("{}: not linked from docs/README.md", rel(&p)));
        }
    }
    let bench_index = docs.join("bench/README.md");
    let linked = linked_files(&bench_index);
    for p in md_in(&docs.join("bench")) {
        if p != bench_index && !linked.contains(&normalize(&p)) {
            unlisted.push(format!("{}: not linked from docs/bench/README.md", rel(&p)));
        }
    }
    assert!(
        unlisted.is_empty(),
        "pages missing from their index:\n  {}",
        unlisted.join("\n  ")
    );
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap().display().to_string()
}
