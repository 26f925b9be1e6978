//! What a conversion reports: warnings while it runs (engine problems, fallbacks), and the plan
//! table, JSON and summary lines the CLI prints from an [`Outcome`].

use super::job::Job;
use super::{Done, Outcome};
use crate::error::{Error, Result};
use crate::plan::{Action, Plan};

/// Parameters, bits per weight of the whole file's tensors and of the 2-D weights.
pub fn totals(plan: &Plan) -> (u64, f64, f64) {
    let (mut n, mut b, mut n2, mut b2) = (0u64, 0u64, 0u64, 0u64);
    for e in &plan.entries {
        let k: u64 = e.dims.iter().product();
        n += k;
        b += e.bytes;
        if e.dims.iter().filter(|&&d| d > 1).count() >= 2 {
            n2 += k;
            b2 += e.bytes;
        }
    }
    let per = |b: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            b as f64 * 8.0 / n as f64
        }
    };
    (n, per(b, n), per(b2, n2))
}

/// Fallbacks (at most 20 named) and requantized tensors, on stderr.
pub(crate) fn fallbacks(plan: &Plan) {
    let fallbacks: Vec<_> = plan.entries.iter().filter(|e| e.fallback).collect();
    for e in fallbacks.iter().take(20) {
        eprintln!(
            "tq: {}: {} -> {} ({})",
            e.name,
            e.src,
            e.dst,
            e.reasons.join("; ")
        );
    }
    if fallbacks.len() > 20 {
        eprintln!(
            "tq: ... and {} more fallbacks (see --dry-run)",
            fallbacks.len() - 20
        );
    }
    let mut requant: std::collections::BTreeMap<String, usize> = Default::default();
    for e in plan
        .entries
        .iter()
        .filter(|e| e.action == Action::Requantize)
    {
        *requant
            .entry(format!("{} -> {}", e.src, e.dst))
            .or_default() += 1;
    }
    for (k, n) in requant {
        eprintln!(
            "tq: requantizing {n} tensors {k} (already-quantized input: quality loss compounds)"
        );
    }
}

/// Problems engines refuse (at most 20 named), on stderr.
pub(crate) fn engine_issues(input: &str, issues: &[String]) {
    for i in issues.iter().take(20) {
        eprintln!("tq: warning: {input}: {i}");
    }
    if issues.len() > 20 {
        eprintln!(
            "tq: warning: {input}: ... and {} more problems engines refuse",
            issues.len() - 20
        );
    }
    if !issues.is_empty() {
        eprintln!("tq: warning: {input}: converting anyway (--strict refuses such input)");
    }
}

/// A written fragment's summary line.
pub(crate) fn shard(
    job: &crate::shard::fragment::Job,
    w: &crate::shard::fragment::Written,
    secs: f64,
) -> String {
    let m = &w.manifest;
    format!(
        "tq convert: wrote fragment {} of shard {}/{} (tensors {}..{} of {}, {} bytes: {} converted, {} copied) in {secs:.1} s",
        job.out.display(),
        m.shard,
        m.shards,
        m.first,
        m.end,
        m.n_tensors,
        w.bytes,
        w.tensors_converted,
        w.tensors_copied,
    )
}

/// `--dry-run --json`: the plan, its totals and the mix.
pub fn plan_json(job: &Job, o: &Outcome) -> Result<String> {
    let plan = &o.plan;
    let (params, bpw, bpw2d) = totals(plan);
    let fallbacks = plan.entries.iter().filter(|e| e.fallback).count();
    let tensors: Vec<_> = plan
        .entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "name": e.name, "shape": e.dims, "source_type": e.src.name(), "type": e.dst.name(),
                "action": e.action, "method": crate::convert::method(e), "bytes": e.bytes, "fallback": e.fallback, "reasons": e.reasons,
            })
        })
        .collect();
    let j = serde_json::json!({
        "input": job.flags.input.display().to_string(), "target": job.profile.name, "file_type": plan.file_type,
        "base_type": plan.base_type.name(), "file_bytes": o.size, "parameters": params,
        "bpw": bpw, "bpw_2d": bpw2d, "fallbacks": fallbacks, "tensors": tensors,
        "mix": o.mix.as_ref().map(|m| m.json()),
    });
    serde_json::to_string_pretty(&j)
        .map_err(|e| Error::internal(format!("JSON encoding of the plan failed: {e}")))
}

/// `--dry-run`: the plan as a table, totals by type and a summary line.
pub fn plan_text(job: &Job, o: &Outcome) -> String {
    use std::fmt::Write;
    let plan = &o.plan;
    let (params, bpw, bpw2d) = totals(plan);
    let fallbacks = plan.entries.iter().filter(|e| e.fallback).count();
    let names: Vec<String> = plan
        .entries
        .iter()
        .map(|e| crate::inspect::cell(&e.name))
        .collect();
    let nw = crate::inspect::column_width(&names, 4);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:nw$}  {:<16} {:<18} {:<11} {:>11}  reason",
        "tensor", "shape", "type", "action", "bytes"
    );
    for (e, name) in plan.entries.iter().zip(&names) {
        let shape = e
            .dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("x");
        let ty = format!("{} -> {}", e.src, e.dst);
        let action = format!("{:?}", e.action).to_lowercase();
        let _ = writeln!(
            s,
            "{name:nw$}  {:<16} {:<18} {:<11} {:>11}  {}",
            shape,
            ty,
            action,
            e.bytes,
            e.reasons.join("; ")
        );
    }
    let mut by: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for e in &plan.entries {
        let x = by.entry(e.dst.name()).or_default();
        x.0 += 1;
        x.1 += e.bytes;
    }
    let _ = writeln!(s);
    for (t, (n, b)) in by {
        let _ = writeln!(s, "  {t:<8} {n:>5} tensors {b:>14} bytes");
    }
    let _ = writeln!(
        s,
        "file: {} bytes ({:.2} MiB), {params} parameters, {bpw:.4} bpw whole file tensors, {bpw2d:.4} bpw 2-D weights; file_type {}; {fallbacks} fallbacks (target '{}')",
        o.size,
        o.size as f64 / 1048576.0,
        plan.file_type.map(|f| f.to_string()).unwrap_or("-".into()),
        job.profile.name
    );
    s
}

/// `--verify --max-kld X`: the line to print (and exit 3) when the written file measured more.
pub fn verify_failed(job: &Job, o: &Outcome) -> Option<String> {
    let (
        Done::Written {
            verified: Some((k, _)),
            ..
        },
        Some(x),
    ) = (&o.done, job.kld_gate())
    else {
        return None;
    };
    (*k > x).then(|| {
        format!(
            "tq: verify failed: {}: mean KLD {k:.5} vs the input is over {} {x}; the file is kept (delete it, or convert with more bits or calibration)",
            job.output.as_deref().unwrap_or(job.flags.input.as_path()).display(),
            if job.flags.max_kld.is_some() { "--max-kld" } else { "--target-kld" }
        )
    })
}

/// A written file's summary: one JSON line (`--json`), or the lines for stderr.
pub fn written(job: &Job, o: &Outcome) -> (Option<String>, Vec<String>) {
    let Done::Written {
        stats,
        secs,
        verified,
    } = &o.done
    else {
        return (None, vec![]);
    };
    let a = &job.flags;
    let out = job.output.as_deref().unwrap_or(a.input.as_path());
    let plan = &o.plan;
    let (params, bpw, bpw2d) = totals(plan);
    if a.json {
        let j = serde_json::json!({
            "input": a.input.display().to_string(), "output": out.display().to_string(),
            "bytes": stats.bytes_written, "seconds": secs, "parameters": params,
            "bpw": bpw, "bpw_2d": bpw2d, "converted": stats.tensors_converted, "copied": stats.tensors_copied,
            "fallbacks": plan.entries.iter().filter(|e| e.fallback).count(),
            "mix": o.mix.as_ref().map(|m| m.json()),
            "verify": verified.map(|(k, s)| serde_json::json!({
                "kld": k, "windows": a.kld_windows, "seconds": s, "max_kld": job.kld_gate(),
                "pass": job.kld_gate().is_none_or(|x| k <= x),
            })),
        });
        return (Some(j.to_string()), vec![]);
    }
    let mut v = vec![format!(
        "wrote {} ({} bytes, {:.3} bpw, {:.3} bpw 2-D weights): {} tensors converted, {} copied, in {:.1} s",
        out.display(),
        stats.bytes_written,
        bpw,
        bpw2d,
        stats.tensors_converted,
        stats.tensors_copied,
        secs
    )];
    if let Some((k, s)) = verified {
        let pred = o
            .mix
            .as_ref()
            .and_then(|m| m.predicted_kld())
            .map_or(String::new(), |p| format!(" (predicted {p:.5})"));
        v.push(format!(
            "verify: mean KLD {k:.5} vs the input on {} windows of {}{pred}, in {s:.1} s",
            a.kld_windows,
            job.kld_text
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ));
    }
    (None, v)
}
