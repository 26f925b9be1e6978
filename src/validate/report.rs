//! The report's three forms: a human table, JSON (the [`Report`] itself, schema versioned by
//! `report_version`), and JUnit XML (one testcase per check; a failure carries the numbers, an
//! undecided check is an `<error type="undecided">`, a skipped one `<skipped>`).

use super::{Bound, Report, Status};

/// The verdict table.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    s += &format!(
        "tq validate: {} ({:.1} MiB)",
        r.artifact,
        r.artifact_bytes as f64 / (1 << 20) as f64
    );
    if let Some(id) = &r.reference {
        s += &format!(" vs {} ({})", id.name, id.kind);
    }
    s += "\n";
    if let Some(q) = &r.quality {
        s += &format!(
            "  {} windows x {} tokens of {}{} ({} tokens scored, {:.1} s)\n",
            q.windows,
            r.ctx,
            r.text.as_deref().unwrap_or("the reference logits"),
            if r.chunks == "auto" {
                format!(
                    ", --chunks auto: stopped at {} of {}",
                    q.windows, q.windows_available
                )
            } else {
                String::new()
            },
            q.tokens_scored,
            q.seconds
        );
        s += &format!("  PPL {:.4} ± {:.4}", q.ppl.value, q.ppl.err);
        if let Some(p) = q.ppl_ref {
            s += &format!(" (reference {:.4} ± {:.4})", p.value, p.err);
        }
        if let Some(m) = q.kld_max {
            s += &format!(", max KLD {m:.4}");
        }
        s += "\n";
    }
    if let Some(b) = &r.backend {
        for line in b.render().lines() {
            s += &format!("  {line}\n");
        }
    }
    s += &format!(
        "  {:<24} {:<9} {:>26}  {:<12} {}\n",
        "check",
        "status",
        format!("value ± {}·SE", r.z),
        "limit",
        "detail"
    );
    for c in &r.checks {
        let val = c.value.map_or(String::new(), |v| {
            format!("{:.6} ± {:.6}", v.value, r.z * v.err)
        });
        let lim = c.limit.map_or(String::new(), |l| {
            format!(
                "{} {}",
                if l.bound == Bound::Max { "<=" } else { ">=" },
                l.value
            )
        });
        s += &format!(
            "  {:<24} {:<9} {:>26}  {:<12} {}\n",
            format!("{}/{}", c.group, c.name),
            c.status.name(),
            val,
            lim,
            c.detail
        );
    }
    s += &format!(
        "verdict: {} (exit {})\n",
        match r.verdict {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Undecided =>
                "UNDECIDED (more windows, --chunks auto, would narrow the intervals)",
            Status::Skipped => "PASS",
        },
        r.exit_code()
    );
    s
}

/// Escape text for XML attributes and content.
fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o += "&amp;",
            '<' => o += "&lt;",
            '>' => o += "&gt;",
            '"' => o += "&quot;",
            '\'' => o += "&apos;",
            c if (c as u32) < 0x20 && c != '\t' => o += &format!("&#{};", c as u32),
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML for one or more reports: one testsuite per artifact, one testcase per check.
pub fn junit(reports: &[Report]) -> String {
    let count = |f: &dyn Fn(Status) -> bool| -> usize {
        reports
            .iter()
            .flat_map(|r| &r.checks)
            .filter(|c| f(c.status))
            .count()
    };
    let tests = count(&|_| true);
    let failures = count(&|s| s == Status::Fail);
    let errors = count(&|s| s == Status::Undecided);
    let skipped = count(&|s| s == Status::Skipped);
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s += &format!(
        "<testsuites name=\"tq validate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">\n"
    );
    for r in reports {
        let n = |st: Status| r.checks.iter().filter(|c| c.status == st).count();
        s += &format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">\n",
            xml(&r.artifact),
            r.checks.len(),
            n(Status::Fail),
            n(Status::Undecided),
            n(Status::Skipped),
            r.seconds
        );
        for c in &r.checks {
            let numbers = match (c.value, c.limit) {
                (Some(v), Some(l)) => format!(
                    "{} = {} ± {} (SE), limit {} {}; ",
                    c.name,
                    v.value,
                    v.err,
                    if l.bound == Bound::Max { "<=" } else { ">=" },
                    l.value
                ),
                (Some(v), None) => format!("{} = {} ± {} (SE); ", c.name, v.value, v.err),
                _ => String::new(),
            };
            let msg = xml(&format!("{numbers}{}", c.detail));
            s += &format!(
                "    <testcase classname=\"tq.validate.{}\" name=\"{}\">",
                xml(&c.group),
                xml(&c.name)
            );
            s += &match c.status {
                Status::Pass => format!("<system-out>{msg}</system-out>"),
                Status::Fail => format!("<failure type=\"fail\" message=\"{msg}\">{msg}</failure>"),
                Status::Undecided => {
                    format!("<error type=\"undecided\" message=\"{msg}\">{msg}</error>")
                }
                Status::Skipped => format!("<skipped message=\"{msg}\"/>"),
            };
            s += "</testcase>\n";
        }
        s += "  </testsuite>\n";
    }
    s += "</testsuites>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_control_characters() {
        assert_eq!(xml("a<b & \"c\"\n"), "a&lt;b &amp; &quot;c&quot;&#10;");
    }
}
