//! Dev tool: write the random-weight architecture fixtures of `fixtures/arch_gen.rs` (issue 14)
//! and their synthetic text, for `scripts/dev/record-arch-fixtures.sh`.
//!
//!   cargo run --release --example gen_arch -- OUTDIR [NAMES...]
//!
//! Writes `OUTDIR/<name>.gguf` for each name (default: all of `ARCH_FIXTURES`) and
//! `OUTDIR/text.txt`.

#[path = "../fixtures/arch_gen.rs"]
mod arch_gen;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!(
            "usage: gen_arch OUTDIR [NAMES...] (names: {})",
            arch_gen::ARCH_FIXTURES.join(", ")
        );
        std::process::exit(2);
    };
    let out = std::path::Path::new(out);
    let names: Vec<&str> = if args.len() > 1 {
        args[1..].iter().map(|s| s.as_str()).collect()
    } else {
        arch_gen::ARCH_FIXTURES.to_vec()
    };
    let fail = |m: String| -> ! {
        eprintln!("error: {m}");
        std::process::exit(1);
    };
    std::fs::create_dir_all(out).unwrap_or_else(|e| fail(format!("{}: {e}", out.display())));
    for n in names {
        let Some(bytes) = arch_gen::arch_fixture(n) else {
            fail(format!(
                "unknown fixture '{n}' (known: {})",
                arch_gen::ARCH_FIXTURES.join(", ")
            ));
        };
        let p = out.join(format!("{n}.gguf"));
        std::fs::write(&p, &bytes).unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
        eprintln!("wrote {} ({} bytes)", p.display(), bytes.len());
    }
    let p = out.join("text.txt");
    std::fs::write(&p, arch_gen::synthetic_text())
        .unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
    eprintln!("wrote {}", p.display());
}
