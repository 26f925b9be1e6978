//! Work split across machines: `tq convert --shard I/N` (a fragment), `tq assemble FRAG… -o
//! OUT.gguf`, `tq calib --shard I/N` and `tq calib merge SHARD… -o H.safetensors`.
use std::path::{Path, PathBuf};
use tq::error::{Error, Result};
use tq::shard::fragment;

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
    /// Average a Hessian file's correlations with a prior's (another calibration of the same
    /// model, e.g. `--self-generate`), keeping its diagonal.
    Blend(BlendArgs),
}

#[derive(clap::Args)]
pub struct BlendArgs {
    /// The calibration's Hessian file (its diagonal and token counts are kept).
    pub hessians: PathBuf,
    /// The prior: a Hessian file of the same model.
    pub prior: PathBuf,
    /// The prior's share of the correlations, 0..=1.
    #[arg(long, default_value_t = 0.5)]
    pub weight: f64,
    /// The blended Hessian file (safetensors, the first file's store).
    #[arg(short, long)]
    pub output: PathBuf,
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
        (Some(CalibSub::Blend(b)), _) => blend(b),
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

fn blend(b: BlendArgs) -> Result<()> {
    tq::io::check_outputs(
        &[("-o", Some(&b.output))],
        &[Some(b.hessians.as_path()), Some(b.prior.as_path())],
    )?;
    let r = tq::calib::blend::blend(&b.hessians, &b.prior, b.weight, &b.output)?;
    eprintln!(
        "tq calib blend: wrote {} Hessians (correlations {} of {}) to {}",
        r.groups,
        b.weight,
        b.prior.display(),
        b.output.display()
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
