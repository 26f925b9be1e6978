//! Greedy generation with the artifact and the reference (the runtime's KV-cached decoder, exact
//! f32 numerics): per prompt, the share of generated positions where both chose the same token,
//! the first divergence, and degenerate-output flags. A model can score a plausible KLD and still
//! loop or emit only special tokens; this catches it.

use super::{verdict, Bound, Check, GenSpec, Limit, Num, PromptGen, Status, Thresholds};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::decode::Decoder;
use crate::model::{Model, Numerics};
use crate::tokenizer::input::Input;
use crate::tokenizer::Tokenizer;

/// Dequantized weights the decoder keeps (beyond this it re-decodes per step: slower, same result).
const DECODER_CACHE_BYTES: usize = 1 << 30;

/// The longest repetition period flagged as a loop.
const MAX_LOOP_PERIOD: usize = 8;

/// Prompts: lines of the prompts file, or `prompts` slices of `prompt_tokens` tokens spread over
/// the input's token stream; each starts with the BOS when the vocabulary adds one.
fn prompts(file: &GgufFile, input: Option<Input>, g: &GenSpec) -> Result<Vec<Vec<u32>>> {
    if let Some(p) = g.prompts_file {
        let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
        let tok = Tokenizer::from_gguf(file)?;
        let v: Vec<Vec<u32>> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| tok.encode(l, true))
            .collect();
        if v.is_empty() {
            return Err(Error::bad_input(p, "no prompts (one per non-empty line)"));
        }
        return Ok(v);
    }
    let Some(input) = input else {
        return Err(Error::Usage(
            "greedy generation needs --text/--tokens or --prompts FILE".into(),
        ));
    };
    let (toks, bos) = input.tokens(file)?;
    let n = g.prompt_tokens.max(1);
    if toks.len() < n + 1 {
        return Err(Error::bad_input(
            input.path(),
            format!("too short for a {n}-token prompt"),
        ));
    }
    let span = toks.len() - n;
    Ok((0..g.prompts)
        .map(|i| {
            let at = 1 + i * span.saturating_sub(1) / g.prompts.max(1);
            bos.into_iter()
                .chain(toks[at..at + n - 1].iter().copied())
                .collect()
        })
        .collect())
}

/// Greedy continuations of every prompt (ties to the lowest id).
fn generate(file: &GgufFile, prompts: &[Vec<u32>], new_tokens: usize) -> Result<Vec<Vec<u32>>> {
    let model = Model::new(file, Numerics::F32)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let dec = Decoder::new(&model, longest + new_tokens, DECODER_CACHE_BYTES)?;
    let mut out = Vec::with_capacity(prompts.len());
    for p in prompts {
        let mut st = dec.state(1);
        let mut logits = vec![];
        for &t in p {
            logits = dec.step(&mut st, &[t])?;
        }
        let mut gen = Vec::with_capacity(new_tokens);
        for i in 0..new_tokens {
            let next = argmax(&logits);
            gen.push(next);
            if i + 1 < new_tokens {
                logits = dec.step(&mut st, &[next])?;
            }
        }
        out.push(gen);
    }
    Ok(out)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Degenerate-output flags: "loop" when the second half of the text repeats with a period of at
/// most [`MAX_LOOP_PERIOD`] tokens, "special-only" when every token is a control token or EOS.
pub(super) fn flags(gen: &[u32], special: &dyn Fn(u32) -> bool) -> Vec<String> {
    let mut f = vec![];
    let n = gen.len();
    if n >= 2 * MAX_LOOP_PERIOD
        && (1..=MAX_LOOP_PERIOD).any(|p| (n / 2 + p..n).all(|i| gen[i] == gen[i - p]))
    {
        f.push("loop".to_string());
    }
    if n > 0 && gen.iter().all(|&t| special(t)) {
        f.push("special-only".to_string());
    }
    f
}

pub(super) fn run(
    file: &GgufFile,
    rf: &GgufFile,
    input: Option<Input>,
    g: &GenSpec,
    t: &Thresholds,
) -> Result<(Vec<PromptGen>, Vec<Check>)> {
    let ps = prompts(file, input, g)?;
    let a = generate(file, &ps, g.new_tokens)?;
    let r = generate(rf, &ps, g.new_tokens)?;
    let types = file
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array());
    let eos = file.get_u64("tokenizer.ggml.eos_token_id");
    // llama.cpp's token type 3 is CONTROL.
    let special = |tok: u32| {
        eos == Some(tok as u64)
            || types
                .and_then(|v| v.get(tok as usize))
                .and_then(|v| v.as_u64())
                == Some(3)
    };
    let mut gens = vec![];
    for (i, (ga, gr)) in a.iter().zip(&r).enumerate() {
        let same = ga.iter().zip(gr).filter(|(x, y)| x == y).count();
        gens.push(PromptGen {
            prompt: i,
            agreement: 100.0 * same as f64 / g.new_tokens.max(1) as f64,
            first_divergence: ga.iter().zip(gr).position(|(x, y)| x != y),
            artifact_flags: flags(ga, &special),
            reference_flags: flags(gr, &special),
        });
    }
    let n = gens.len() as f64;
    let mean = gens.iter().map(|p| p.agreement).sum::<f64>() / n;
    let var = gens
        .iter()
        .map(|p| (p.agreement - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0).max(1.0);
    let v = Num {
        value: mean,
        err: (var / n).sqrt(),
    };
    let shown = format!(
        "agreement {:.1}% ± {:.1} over {} prompts x {} tokens; first divergence {}",
        v.value,
        v.err,
        gens.len(),
        g.new_tokens,
        gens.iter()
            .map(|p| p.first_divergence.map_or("-".into(), |d| d.to_string()))
            .collect::<Vec<_>>()
            .join("/")
    );
    let mut agree = match t.min_gen_agreement {
        None => Check::new(
            "generation",
            "agreement",
            Status::Skipped,
            format!("{shown}; no threshold (--min-gen-agreement)"),
        ),
        Some(l) => {
            let lim = Limit {
                bound: Bound::Min,
                value: l,
            };
            let mut c = Check::new(
                "generation",
                "agreement",
                verdict(v.value, v.err, lim),
                shown,
            );
            c.limit = Some(lim);
            c
        }
    };
    agree.value = Some(v);
    let bad: Vec<String> = gens
        .iter()
        .filter(|p| {
            p.artifact_flags
                .iter()
                .any(|f| !p.reference_flags.contains(f))
        })
        .map(|p| format!("prompt {}: {}", p.prompt, p.artifact_flags.join("+")))
        .collect();
    let degenerate = if bad.is_empty() {
        Check::new(
            "generation",
            "degenerate",
            Status::Pass,
            "no loop or special-only output the reference does not also produce",
        )
    } else {
        Check::new(
            "generation",
            "degenerate",
            Status::Fail,
            format!(
                "degenerate output where the reference has none: {}",
                bad.join(", ")
            ),
        )
    };
    Ok((gens, vec![agree, degenerate]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_and_special_only_are_flagged() {
        let none = |_: u32| false;
        let varied: Vec<u32> = (0..32).collect();
        assert!(flags(&varied, &none).is_empty());
        let mut looped: Vec<u32> = (0..16).collect();
        looped.extend([7, 8, 9].iter().cycle().take(16));
        assert_eq!(flags(&looped, &none), vec!["loop"]);
        // A period longer than MAX_LOOP_PERIOD is not a loop.
        let long: Vec<u32> = (0..9).cycle().take(32).collect();
        assert!(flags(&long, &none).is_empty());
        let eos = |t: u32| t == 2;
        assert_eq!(flags(&[2; 4], &eos), vec!["special-only"]);
        assert!(flags(&[2, 3, 2, 2], &eos).is_empty());
    }

    #[test]
    fn argmax_takes_the_lowest_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }
}
