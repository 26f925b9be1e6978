//! Work split across machines: `tq convert --shard I/N` (a fragment), `tq assemble FRAG… -o
//! OUT.gguf`, `tq calib --shard I/N` and `tq calib merge SHARD… -o H.safetensors`.
use std::path::{Path, PathBuf};
use tq::error::{Error, Result};
use tq::shard::{fragment, Shard};

/// `tq calib`: a calibration run, or `tq calib merge`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CalibCmd {
    #[command(subcommand)]
    pub sub: Option<CalibSub>,
    #[command(flatten)]
    pub run: Option<super::calib::CalibArgs>,
}

#[derive(clap::Subcommand)]
pub enum CalibSub {
    /// Sum the Hessian shards of `tq calib --shard I/N` (a complete set, any order) into one
    /// Hessian file, in shard order.
    Merge(MergeArgs),
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The shard files (one per I of N).
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
    /// The merged Hessian file (safetensors, F64).
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn calib(a: CalibCmd) -> Result<()> {
    match (a.sub, a.run) {
        (Some(CalibSub::Merge(m)), _) => merge(m),
        (None, Some(r)) => super::calib::run(r),
        (None, None) => Err(Error::Usage(
            "tq calib: give MODEL --text FILE -o H.safetensors, or tq calib merge SHARD… -o H.safetensors"
                .into(),
        )),
    }
}

fn merge(m: MergeArgs) -> Result<()> {
    let inputs: Vec<Option<&Path>> = m.shards.iter().map(|p| Some(p.as_path())).collect();
    tq::io::check_outputs(&[("-o", Some(&m.output))], &inputs)?;
    let r = tq::shard::merge::merge(&m.shards, &m.output)?;
    eprintln!(
        "tq calib merge: wrote {} Hessians ({} windows from {} shards) to {}",
        r.groups,
        r.windows,
        r.shards,
        m.output.display()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct AssembleArgs {
    /// The fragments of `tq convert --shard I/N` (a complete set, any order).
    #[arg(required = true)]
    pub fragments: Vec<PathBuf>,
    /// Output GGUF (written atomically).
    #[arg(short, long)]
    pub output: PathBuf,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn assemble(a: AssembleArgs) -> Result<()> {
    let inputs: Vec<Option<&Path>> = a.fragments.iter().map(|p| Some(p.as_path())).collect();
    tq::io::check_outputs(&[("-o", Some(&a.output))], &inputs)?;
    let t0 = std::time::Instant::now();
    let n = fragment::assemble(&a.fragments, &a.output, &|_| {})?;
    if !a.quiet {
        eprintln!(
            "tq assemble: wrote {} ({n} bytes) from {} fragments in {:.1} s",
            a.output.display(),
            a.fragments.len(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `tq convert --shard`: refused before any work for `--calib TEXT` (calibration needs every
/// block of the model in one process; shard it with `tq calib --shard` instead).
pub fn check_convert_shard(shard: Option<&str>, calib_is_text: bool) -> Result<Option<Shard>> {
    let Some(s) = shard else { return Ok(None) };
    let s = Shard::parse(s)?;
    if calib_is_text {
        return Err(Error::Usage(format!(
            "tq convert --shard {s}: --calib TEXT calibrates in this process; run tq calib --shard I/N on each machine, tq calib merge, then tq convert --shard {s} --calib H.safetensors"
        )));
    }
    Ok(Some(s))
}

/// Write shard `job.shard`'s fragment and report it.
pub fn convert_shard(job: &fragment::Job, quiet: bool) -> Result<()> {
    let t0 = std::time::Instant::now();
    let w = fragment::write(job, &|_| {})?;
    if !quiet {
        let m = &w.manifest;
        eprintln!(
            "tq convert: wrote fragment {} of shard {}/{} (tensors {}..{} of {}, {} bytes: {} converted, {} copied) in {:.1} s",
            job.out.display(),
            m.shard,
            m.shards,
            m.first,
            m.end,
            m.n_tensors,
            w.bytes,
            w.tensors_converted,
            w.tensors_copied,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
