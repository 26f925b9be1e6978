//! The harness report as `tq kernels check` prints it.

use super::Report;

/// The report as the CLI prints it: one line per kernel and data set.
pub fn format_report(rep: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "backend {} on {}", rep.backend.name(), rep.device);
    let _ = writeln!(
        s,
        "{:<8} {:<10} {:<66} {:>8} {:>10} {:>10} {:>10} {:>6} {:>10}  result",
        "type", "kernel", "data", "values", "bit-exact", "max-abs", "max-rel", "ulp", "err/S",
    );
    for r in &rep.results {
        let exact = if r.bit_exact == r.values {
            "all".to_string()
        } else {
            format!("{}", r.bit_exact)
        };
        let _ = writeln!(
            s,
            "{:<8} {:<10} {:<66} {:>8} {:>10} {:>10.3e} {:>10.3e} {:>6} {:>10.3e}  {} ({})",
            r.ty.name(),
            r.kind.name(),
            r.data,
            r.values,
            exact,
            r.max_abs,
            r.max_rel,
            r.max_ulp,
            r.max_err_over_abs_sum,
            if r.pass { "PASS" } else { "FAIL" },
            r.tolerance
        );
        if let Some(f) = &r.first_failure {
            if !r.pass {
                let _ = writeln!(s, "         first failure: {f}");
            }
        }
    }
    for n in &rep.notes {
        let _ = writeln!(s, "note: {n}");
    }
    for t in &rep.throughput {
        let _ = write!(
            s,
            "throughput {:<7} {:>9} values  {:>9.3} ms  {:>8.2} GB/s",
            t.ty.name(),
            t.values,
            t.seconds * 1e3,
            t.gbs
        );
        if let Some(p) = rep.peak_gbs {
            let _ = write!(s, "  ({:.1}% of {:.0} GB/s peak)", 100.0 * t.gbs / p, p);
        }
        let _ = writeln!(s);
    }
    for m in &rep.matvec_times {
        let _ = writeln!(
            s,
            "matvec     {:<7} {:<18} {:>5}x{:<5} {:>9.3} ms  {:>8.3} GB/s of weights",
            m.ty.name(),
            m.shape,
            m.rows,
            m.cols,
            m.seconds * 1e3,
            m.gbs
        );
    }
    let (pass, total) = (
        rep.results.iter().filter(|r| r.pass).count(),
        rep.results.len(),
    );
    let _ = writeln!(s, "{pass} passed, {} failed", total - pass);
    s
}
