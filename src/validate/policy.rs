//! Policy files (thresholds per artifact-name pattern, so one CI step validates a directory) and
//! regression against a baseline report. Schemas in `docs/validate.md`.

use super::{verdict, Bound, Check, Limit, Report, Thresholds, REPORT_VERSION};
use crate::error::{one_line, Error, Result};
use serde::Deserialize;
use std::path::Path;

/// The policy schema's version.
pub const POLICY_VERSION: u32 = 1;

/// Relative regression allowed against a baseline when `--max-regression` is not given.
pub const DEFAULT_MAX_REGRESSION: f64 = 0.10;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub policy_version: u32,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Glob on the artifact's file name (`*` any run of characters, `?` one).
    #[serde(rename = "match")]
    pub pattern: String,
    #[serde(default)]
    pub thresholds: Thresholds,
}

impl Policy {
    /// Read and check a policy file (JSON). Any problem is one line naming the file.
    pub fn load(path: &Path) -> Result<Policy> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text).map_err(|m| Error::bad_input(path, m))
    }

    pub fn parse(text: &str) -> std::result::Result<Policy, String> {
        let p: Policy = serde_json::from_str(text)
            .map_err(|e| format!("not a valid policy ({e}); the schema is in docs/validate.md"))?;
        if p.policy_version != POLICY_VERSION {
            return Err(format!(
                "policy_version {} is not supported (this tq reads {POLICY_VERSION})",
                p.policy_version
            ));
        }
        if p.rules.is_empty() {
            return Err(
                "no rules: give at least one {\"match\": \"*\", \"thresholds\": {...}}".into(),
            );
        }
        for r in &p.rules {
            if r.pattern.is_empty() {
                return Err("a rule has an empty \"match\" pattern".into());
            }
            r.thresholds
                .check()
                .map_err(|e| format!("rule '{}': {e}", one_line(&r.pattern)))?;
        }
        Ok(p)
    }

    /// The first rule matching `file_name`.
    pub fn rule_for(&self, file_name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| glob(&r.pattern, file_name))
    }
}

/// `*` matches any run of characters, `?` one character, anything else itself.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // ok[j]: pattern[..i] matches name[..j], row by row over i.
    let mut ok = vec![false; n.len() + 1];
    ok[0] = true;
    for &c in &p {
        let mut next = vec![false; n.len() + 1];
        if c == '*' {
            let mut any = false;
            for j in 0..=n.len() {
                any |= ok[j];
                next[j] = any;
            }
        } else {
            for j in 1..=n.len() {
                next[j] = ok[j - 1] && (c == '?' || c == n[j - 1]);
            }
        }
        ok = next;
    }
    ok[n.len()]
}

/// Regression checks against `base`: each quality number may be worse than the baseline's by at
/// most `max_regression` (relative). The baseline value times (1 ± max_regression) is the limit
/// and the current estimate is judged against it like any threshold (±Z standard errors of this
/// run): both runs score the same tokens against the same reference (checked), so the text's
/// sampling noise is shared and only this run's error is counted. A baseline made with another
/// report version, reference, text or ctx is refused.
pub fn regression(cur: &Report, base: &Report, max_regression: Option<f64>) -> Result<Vec<Check>> {
    let refuse = |what: &str| {
        Err(Error::Usage(format!(
            "the baseline report ({}) was made with a different {what}; make a new baseline with this reference, text and --ctx",
            one_line(&base.artifact)
        )))
    };
    if base.report_version != REPORT_VERSION {
        return refuse("report version");
    }
    if base.reference.as_ref().map(|r| &r.blake3) != cur.reference.as_ref().map(|r| &r.blake3) {
        return refuse("reference");
    }
    if base.tokens_blake3 != cur.tokens_blake3 {
        return refuse("text (token windows)");
    }
    if base.ctx != cur.ctx {
        return refuse("ctx");
    }
    let r = max_regression.unwrap_or(DEFAULT_MAX_REGRESSION);
    let (Some(q), Some(b)) = (&cur.quality, &base.quality) else {
        return Ok(vec![Check::new(
            "regression",
            "baseline",
            super::Status::Skipped,
            "no quality numbers in this run or the baseline",
        )]);
    };
    let pairs = [
        ("ppl_ratio", q.ppl_ratio, b.ppl_ratio, Bound::Max),
        ("kld", q.kld, b.kld, Bound::Max),
        ("kld_p99", q.kld_p99, b.kld_p99, Bound::Max),
        ("top1", q.top1, b.top1, Bound::Min),
    ];
    let mut out = vec![];
    for (name, c, bv, bound) in pairs {
        let (Some(c), Some(bv)) = (c, bv) else {
            continue;
        };
        let f = match bound {
            Bound::Max => 1.0 + r,
            Bound::Min => 1.0 - r,
        };
        let lim = Limit {
            bound,
            value: bv.value * f,
        };
        let mut ch = Check::new(
            "regression",
            name,
            verdict(c.value, c.err, lim),
            format!(
                "baseline {:.6} ± {:.6}, allowed {:.0}% worse",
                bv.value,
                bv.err,
                100.0 * r
            ),
        );
        ch.value = Some(c);
        ch.limit = Some(lim);
        out.push(ch);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_a_shell() {
        assert!(glob("*", "a.gguf"));
        assert!(glob("*q8_0*.gguf", "smol-q8_0.gguf"));
        assert!(!glob("*q8_0*.gguf", "smol-tq4_1s.gguf"));
        assert!(glob("smol-??.gguf", "smol-q4.gguf"));
        assert!(!glob("smol-?.gguf", "smol-q4.gguf"));
        assert!(glob("a*b*c", "aXbYbc"));
        assert!(!glob("a*b*c", "aXbYb"));
    }

    #[test]
    fn policy_errors_are_one_line_and_name_the_problem() {
        let bad = Policy::parse(
            r#"{"policy_version":1,"rules":[{"match":"*","thresholds":{"max_kl":0.1}}]}"#,
        )
        .unwrap_err();
        assert!(bad.contains("unknown field `max_kl`"), "{bad}");
        assert!(!bad.contains('\n'));
        let v = Policy::parse(r#"{"policy_version":2,"rules":[]}"#).unwrap_err();
        assert!(v.contains("policy_version 2"), "{v}");
        let none = Policy::parse(r#"{"policy_version":1,"rules":[]}"#).unwrap_err();
        assert!(none.contains("no rules"), "{none}");
        let range = Policy::parse(
            r#"{"policy_version":1,"rules":[{"match":"*","thresholds":{"min_top1":150}}]}"#,
        )
        .unwrap_err();
        assert!(range.contains("min_top1"), "{range}");
        let p = Policy::parse(
            r#"{"policy_version":1,"rules":[{"match":"*q8*","thresholds":{"max_kld":0.01}},{"match":"*","thresholds":{"max_kld":0.5}}]}"#,
        )
        .unwrap();
        assert_eq!(
            p.rule_for("m-q8_0.gguf").unwrap().thresholds.max_kld,
            Some(0.01)
        );
        assert_eq!(
            p.rule_for("m-tq3.gguf").unwrap().thresholds.max_kld,
            Some(0.5)
        );
    }
}
