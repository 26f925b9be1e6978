//! `tq conformance FILE...`: run conformance vector files (the fork's five and the seed design's
//! 2-bit file) through tq's CPU references; pass counts per op, non-zero exit on any mismatch.
//! Guide: `docs/conformance.md`.
use std::path::PathBuf;
use tq::error::{Error, Result};

#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// Vector files (`../shared/conformance/*.json`: tq4_1s, tq3_1s, turbo2_0/3_0/4_0, seed2bit).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where to run: cpu (the reference kernels; the only backend this command has so far).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// How many failing cases to list per file.
    #[arg(long, default_value_t = 20)]
    pub show: usize,
}

pub fn run(a: ConformanceArgs) -> Result<()> {
    if a.backend != "cpu" {
        return Err(Error::Usage(format!(
            "--backend {}: tq conformance runs the CPU reference only (`cpu`); GPU kernels are checked by `tq kernels check`",
            a.backend
        )));
    }
    let mut failed = Vec::new();
    for path in &a.files {
        let rep = tq::conformance::run_file(path)?;
        println!("{}: {}", path.display(), rep.schema);
        for o in &rep.ops {
            let mark = if o.pass == o.total { "ok" } else { "FAIL" };
            println!("  {:<24} {:>5}/{:<5} {mark}", o.op, o.pass, o.total);
        }
        for f in rep.failures.iter().take(a.show) {
            println!("  mismatch: {f}");
        }
        if rep.failures.len() > a.show {
            println!("  ... {} more mismatches", rep.failures.len() - a.show);
        }
        if !rep.pass() {
            failed.push(format!("{} ({} cases)", path.display(), rep.failures.len()));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Unsupported(format!(
            "conformance mismatches in {}; the implementation is not bit-exact with these vectors",
            failed.join(", ")
        )))
    }
}
