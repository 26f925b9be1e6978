//! Command line: a thin clap layer over the library. Each subcommand lives in its own file.

pub mod calib;
pub mod codebook;
pub mod conformance;
pub mod convert;
pub mod eval;
pub mod inspect;
pub mod kernels;
pub mod kv;
pub mod shard;
pub mod validate;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tq",
    version,
    about = "Quantize LLMs offline to GGUF with TurboQuant formats"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a GGUF or safetensors file: metadata, tensors, totals per type, bits per weight.
    Inspect(inspect::InspectArgs),
    /// Convert/quantize a model to GGUF (TQ4_1S, TQ3_1S, q8_0, ... with recipes and overrides).
    Convert(convert::ConvertArgs),
    /// Perplexity and KL divergence of a model on a text (llama-perplexity compatible).
    Eval(eval::EvalArgs),
    /// Accumulate per-layer input Hessians (H = Σ x xᵀ) over calibration text, for LDLQ
    /// (`tq calib merge` sums the shards of `tq calib --shard I/N`).
    Calib(shard::CalibCmd),
    /// Join the fragments of `tq convert --shard I/N` into the GGUF a one-process convert writes.
    Assemble(shard::AssembleArgs),
    /// Compute Lloyd-Max codebooks for a head dim / bit width and emit them for an engine.
    Codebook(codebook::CodebookArgs),
    /// KV-cache presets for a model: recommended -ctk/-ctv, or measured with --measure.
    Kv(kv::KvCmdArgs),
    /// Check the bundled GPU decode kernels (CUDA, Metal, WGSL) against the CPU reference.
    Kernels(kernels::KernelsArgs),
    /// CI gate: structure, quality vs a reference (noise-aware verdicts), generation, regression.
    /// Exit 0 pass, 3 a check failed, 4 undecided, 2 bad input/usage, 1 I/O, 70 a bug in tq.
    Validate(validate::ValidateArgs),
    /// Run conformance vector files (tq4_1s, tq3_1s, turbo*, seed2bit) through the CPU reference.
    Conformance(conformance::ConformanceArgs),
}

/// `--threads` above this many per available core is refused (thousands of threads stall the
/// machine and gain nothing).
const MAX_THREADS_PER_CORE: usize = 4;

/// The one thread policy, for every command: `--threads N` workers (0, or more than
/// [`MAX_THREADS_PER_CORE`] x the available cores, is a usage error), by default all cores. Resolved once, here; the library runs in the pool it is called from.
fn thread_pool(threads: Option<usize>) -> tq::error::Result<(rayon::ThreadPool, usize)> {
    use tq::error::Error;
    if threads == Some(0) {
        return Err(Error::Usage("--threads must be at least 1".into()));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(t) = threads.filter(|&t| t > MAX_THREADS_PER_CORE * cores) {
        return Err(Error::Usage(format!(
            "--threads {t} is more than {MAX_THREADS_PER_CORE} x the {cores} available cores; give at most {}",
            MAX_THREADS_PER_CORE * cores
        )));
    }
    let n = threads.unwrap_or(cores);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {n} threads: {e}")))?;
    Ok((pool, n))
}

/// Run `f` in the [`thread_pool`] for `--threads`, giving it the worker count.
pub fn with_thread_pool<R: Send>(
    threads: Option<usize>,
    f: impl FnOnce(usize) -> tq::error::Result<R> + Send,
) -> tq::error::Result<R> {
    let (pool, n) = thread_pool(threads)?;
    pool.install(|| f(n))
}

/// Parse arguments, run, and map errors to a one-line message and an exit code.
/// Rust ignores SIGPIPE, so `println!` into a closed pipe (`tq inspect … | head -1`) panics.
/// A command-line filter should end quietly instead, as cat and grep do.
fn restore_default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: sets the disposition of one signal to its default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

pub fn main() -> i32 {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Convert(a) => return report_error(convert::run(a)),
        Command::Calib(a) => shard::calib(a),
        Command::Assemble(a) => shard::assemble(a),
        Command::Eval(a) => eval::run(a),
        Command::Codebook(a) => codebook::run(a),
        Command::Kernels(a) => kernels::run(a),
        Command::Kv(a) => kv::run(a),
        Command::Validate(a) => return report_error(validate::run(a)),
        Command::Conformance(a) => conformance::run(a),
    };
    report_error(r.map(|()| 0))
}

/// The exit code of a command's result: its own on success, the error's otherwise (after
/// printing the error on one line).
fn report_error(r: tq::error::Result<i32>) -> i32 {
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}", error_line(&e));
            e.exit_code()
        }
    }
}

/// What [`report_error`] prints for `e`: one line, always (a message from a library below us may
/// carry line breaks).
fn error_line(e: &tq::error::Error) -> String {
    let msg = e.to_string();
    let msg: Vec<&str> = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    format!("tq: error: {}", msg.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tq::error::Error;

    /// A bug in tq (`Error::Internal`) exits 70 (EX_SOFTWARE) with one line asking for a report;
    /// the user's own mistakes keep 2, and I/O 1.
    #[test]
    fn internal_error_exits_70_with_one_line() {
        let e = Error::Internal("writer thread panicked\n  at src/convert.rs:514".into());
        let line = error_line(&e);
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.starts_with("tq: error: internal error: writer thread panicked"),
            "{line}"
        );
        assert!(line.contains("bug in tq; please report it"), "{line}");
        assert_eq!(report_error(Err(e)), 70);
        assert_eq!(report_error(Err(Error::Usage("--threads".into()))), 2);
        assert_eq!(report_error(Ok(4)), 4);
    }
}
