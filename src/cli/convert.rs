//! `tq convert INPUT -o OUT.gguf [--weights TYPE] [--recipe R] ...`
use std::path::PathBuf;
use tq::error::Result;
use tq::pipeline::{self, report, ConvertFlags, Done, Job};
use tq::quant::LdlqSettings;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Input model (GGUF).
    pub input: PathBuf,
    /// Output GGUF (written atomically: temp file + fsync + rename).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Default type of 2-D weights (tq4_1s, tq3_1s, q8_0, q4_0, q4_1, f16, bf16, f32, ...).
    /// Without --weights, --recipe or overrides every tensor keeps its type (a pure copy); with
    /// any of them but no --weights, the default is tq4_1s.
    #[arg(long)]
    pub weights: Option<String>,
    /// llama-quantize's file type by name (Q4_K_M, Q6_K, IQ4_XS, IQ2_XS, ...): every tensor gets
    /// the type llama-quantize would give it, then round-to-nearest, --imatrix or --calib apply
    /// as usual. Not with --weights, --recipe, --target-bpw or --target-size.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// pure | config-i | hybrid | premium (see `docs/user-guide.md`).
    #[arg(long)]
    pub recipe: Option<String>,
    /// REGEX=TYPE for tensors whose name matches (repeatable; first match wins). Without
    /// --weights, every other 2-D weight is quantized to tq4_1s (give --weights to choose).
    #[arg(long = "tensor-type", value_name = "REGEX=TYPE")]
    pub tensor_type: Vec<String>,
    /// File with one REGEX=TYPE per line (after the --tensor-type flags).
    #[arg(long)]
    pub tensor_type_file: Option<PathBuf>,
    /// Type of output.weight.
    #[arg(long)]
    pub output_tensor_type: Option<String>,
    /// Type of token_embd.weight.
    #[arg(long)]
    pub token_embedding_type: Option<String>,
    /// Any fallback (row length, engine constraint), and any problem that makes engines refuse
    /// the file (tensor name over 63 bytes, missing or zero hyper-parameter, missing tensor,
    /// wrong shape; warnings otherwise), is an error, before anything is written.
    #[arg(long)]
    pub strict: bool,
    /// Print the plan and totals; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// JSON output (plan with --dry-run, summary otherwise).
    #[arg(long)]
    pub json: bool,
    /// Target engine profile: fork (default), fork-pre-2026-04-15, upstream.
    #[arg(long)]
    pub target: Option<String>,
    /// JSON type map for other forks (instead of --target).
    #[arg(long, conflicts_with = "target")]
    pub type_map: Option<PathBuf>,
    /// Worker threads (default: all cores). Output bytes do not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Calibration Hessians from `tq calib` (safetensors), or a UTF-8 text file to calibrate on
    /// first, in this command: TQ tensors with a Hessian are quantized with banded LDLQ (same
    /// bytes per weight; the engine's decoder is unchanged).
    #[arg(long)]
    pub calib: Option<PathBuf>,
    /// With --calib TEXT: calibration tokens (as `tq calib --tokens`).
    #[arg(long, requires = "calib", default_value_t = 8192)]
    pub calib_tokens: usize,
    /// With --calib TEXT: window length (as `tq calib --ctx`).
    #[arg(long, requires = "calib", default_value_t = 512)]
    pub calib_ctx: usize,
    /// With --calib TEXT: windows per forward pass (as `tq calib --batch`).
    #[arg(long, requires = "calib", default_value_t = 4)]
    pub calib_batch: usize,
    /// With --calib TEXT: sequential (GPTQ-order) calibration of exactly this conversion's plan
    /// (as `tq calib --sequential`).
    #[arg(long, requires = "calib")]
    pub calib_sequential: bool,
    /// With --calib H.safetensors: use an interrupted `tq calib` checkpoint (fewer windows or
    /// blocks than it was started with) as it is, instead of refusing it.
    #[arg(long, requires = "calib")]
    pub allow_partial_calib: bool,
    /// llama.cpp imatrix (GGUF from `llama-imatrix` / `tq calib --imatrix-out`, or legacy .dat):
    /// stock tensors without LDLQ get block parameters fitted under its per-column importance
    /// (diagonal-only weighting; round-to-nearest values).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// LDLQ error-feedback band in columns (0 = full). Unset: 64 for IQ1_S / IQ1_M, full for
    /// every other type.
    #[arg(long)]
    pub ldlq_band: Option<usize>,
    /// LDLQ damping λ: H += λ·mean(diag(H))·I (raised ×10 on Cholesky failure).
    /// Unset: each type's default (0.01 today for every type).
    #[arg(long)]
    pub damp: Option<f64>,
    /// LDLQ: shrink the Hessian towards its diagonal before damping, H ← (1 − s)·H + s·diag(H)
    /// (0: the Hessian as calibrated; 1: diagonal only, no error feedback). Unset: 0.25 for the
    /// stock types and tq2_r / tq2_t, 0.5 for IQ2 / IQ3, 0 for IQ1 and the other tq types.
    #[arg(long, value_name = "S")]
    pub shrink: Option<f64>,
    /// Stock types: after the LDLQ sweep, refit each row's block parameters to its codes under
    /// the Hessian and sweep again, this many times (0: off; each pass costs about one more
    /// sweep, and a third n×n f64 matrix is alive while factoring).
    #[arg(long, default_value_t = tq::quant::ldlq::Refit::DEFAULT.passes, value_name = "N")]
    pub ldlq_refit: usize,
    /// Continue an interrupted conversion (killed, out of time, Ctrl-C) from its last checkpoint:
    /// the same command plus --resume. The output is byte-identical to an uninterrupted run; a
    /// checkpoint of a different command is refused.
    #[arg(long)]
    pub resume: bool,
    /// No progress bar and no notices (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
    /// Convert only shard I of N (0-based) of the tensors, balanced by work, into a
    /// fragment at -o; `tq assemble` joins a complete set into the GGUF this command writes
    /// without --shard (see docs/scale.md). With --calib, only a Hessian file.
    #[arg(long, value_name = "I/N", conflicts_with = "dry_run")]
    pub shard: Option<String>,
    /// Choose a type per tensor for a file of at most X bits per parameter (the whole file:
    /// metadata and unquantized tensors count), minimizing the predicted KLD (see
    /// docs/user-guide.md, "A mix for a target size").
    #[arg(long, value_name = "X")]
    pub target_bpw: Option<f64>,
    /// As --target-bpw, for a file of at most SIZE (bytes, or 100MB, 95MiB, 1.5GB).
    #[arg(long, value_name = "SIZE")]
    pub target_size: Option<String>,
    /// Choose the smallest mix whose predicted KLD (calibrated on measured plans) is at most X,
    /// confirmed on --kld-text's windows (a larger size when the measurement is above X).
    #[arg(long, value_name = "X")]
    pub target_kld: Option<f64>,
    /// Candidate types of the mix, comma-separated (default: what --target loads: stock types,
    /// plus tq3_1s/tq4_1s for the fork).
    #[arg(long, value_name = "LIST")]
    pub types: Option<String>,
    /// Rows sampled per tensor for the mix's error estimate (rows over 4096 wide: fewer, the same elements).
    #[arg(long, default_value_t = 64)]
    pub mix_rows: usize,
    /// Of --mix-rows, the rows quantized with LDLQ as convert would; the rest are estimated from
    /// those by a first-order proxy (at least --mix-rows: every sampled row with LDLQ, slower).
    #[arg(long, default_value_t = tq::quant::sensitivity::EXACT_ROWS)]
    pub mix_exact_rows: usize,
    /// Blocks whose tensors the mix measures with LDLQ, evenly spaced, the first and last among
    /// them; the other blocks' tensors are estimated from LDLQ on their Hessians' 512-column
    /// diagonal blocks, scaled by the same tensor's ratio in the measured blocks (0: every
    /// block, ≈ 3× slower on a 32-block 7B). Models at most 2048 wide: every block.
    #[arg(long, default_value_t = tq::plan::mix::EXACT_BLOCKS, value_name = "K")]
    pub mix_exact_blocks: usize,
    /// Text for the mix's KLD fit and for --verify (default: --calib when it is a text file).
    #[arg(long, value_name = "FILE")]
    pub kld_text: Option<PathBuf>,
    /// Windows of 512 tokens of --kld-text for the fit and --verify (at least 2).
    #[arg(long, default_value_t = 2)]
    pub kld_windows: usize,
    /// Single-tensor KLDs measured for the mix's fit (round-robin over the roles: 14 = two
    /// per role of a llama block).
    #[arg(long, default_value_t = 14)]
    pub kld_probes: usize,
    /// Save the mix's measurements (sensitivity, single-tensor KLDs, fit) in FILE, or reuse
    /// them when FILE holds those of this model, calibration, candidate types and KLD text: a
    /// second size plans in seconds.
    #[arg(long, value_name = "FILE")]
    pub mix_cache: Option<PathBuf>,
    /// After writing, measure the output's KLD against the input on --kld-text.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: exit 3 when the written file's mean KLD exceeds X (the file is kept).
    #[arg(long, value_name = "X", requires = "verify")]
    pub max_kld: Option<f64>,
    /// Do not add tq.* provenance keys (for byte-exact copies). general.file_type is still set
    /// from the plan when types change (it describes the tensors written).
    #[arg(long)]
    pub no_provenance: bool,
}

/// Exit 0, or 3 when `--verify --max-kld X` measured more than X.
pub fn run(a: ConvertArgs) -> Result<i32> {
    let threads = a.threads;
    let job = Job::resolve(flags(a))?;
    super::with_thread_pool(threads, |_| {
        let o = pipeline::convert(&job)?;
        tq::quant::ldlq::prof::report();
        match &o.done {
            Done::DryRun if job.flags.json => println!("{}", report::plan_json(&job, &o)?),
            Done::DryRun => print!("{}", report::plan_text(&job, &o)),
            Done::Shard(line) if !job.flags.quiet => eprintln!("{line}"),
            Done::Shard(_) => {}
            Done::Written { .. } => match report::written(&job, &o) {
                (Some(json), _) => println!("{json}"),
                (None, lines) if !job.flags.quiet => lines.iter().for_each(|l| eprintln!("{l}")),
                _ => {}
            },
        }
        // A failed gate is reported even under --quiet and --json.
        Ok(match report::verify_failed(&job, &o) {
            Some(line) => {
                eprintln!("{line}");
                3
            }
            None => 0,
        })
    })
}

/// The flags as the library's plain values.
fn flags(a: ConvertArgs) -> ConvertFlags {
    ConvertFlags {
        input: a.input,
        output: a.output,
        weights: a.weights,
        preset: a.preset,
        recipe: a.recipe,
        tensor_type: a.tensor_type,
        tensor_type_file: a.tensor_type_file,
        output_tensor_type: a.output_tensor_type,
        token_embedding_type: a.token_embedding_type,
        strict: a.strict,
        dry_run: a.dry_run,
        json: a.json,
        target: a.target,
        type_map: a.type_map,
        calib: a.calib,
        calib_tokens: a.calib_tokens,
        calib_ctx: a.calib_ctx,
        calib_batch: a.calib_batch,
        calib_sequential: a.calib_sequential,
        allow_partial_calib: a.allow_partial_calib,
        imatrix: a.imatrix,
        ldlq: LdlqSettings {
            band: a.ldlq_band,
            damp: a.damp,
            refit: a.ldlq_refit,
            shrink: a.shrink,
        },
        resume: a.resume,
        quiet: a.quiet,
        shard: a.shard,
        target_bpw: a.target_bpw,
        target_size: a.target_size,
        target_kld: a.target_kld,
        types: a.types,
        mix_rows: a.mix_rows,
        mix_exact_rows: a.mix_exact_rows,
        mix_exact_blocks: a.mix_exact_blocks,
        kld_text: a.kld_text,
        kld_windows: a.kld_windows,
        kld_probes: a.kld_probes,
        mix_cache: a.mix_cache,
        verify: a.verify,
        max_kld: a.max_kld,
        no_provenance: a.no_provenance,
        mix_in_memory: false,
    }
}
