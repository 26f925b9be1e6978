//! The `tokenizer.ggml.pre` names `tq` implements, grouped by pre-tokenizer family, and the
//! regex steps of each (llama.cpp's `llm_tokenizer_bpe` table).

use super::pretokenize::Step;
use crate::error::Result;

/// The `tokenizer.ggml.pre` values we implement, grouped by pre-tokenizer (llama.cpp's names).
pub(super) const PRE_FAMILIES: &[(&[&str], Pre)] = &[
    (&["default"], Pre::Default),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        Pre::Llama3,
    ),
    (&["dbrx", "smaug-bpe"], Pre::Dbrx),
    (&["chatglm-bpe"], Pre::ChatGlm),
    (&["glm4", "glm5"], Pre::Glm4),
    (&["deepseek-llm"], Pre::DeepseekLlm),
    (&["deepseek-coder"], Pre::DeepseekCoder),
    (&["falcon"], Pre::Falcon),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
        ],
        Pre::Gpt2,
    ),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        Pre::Starcoder,
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        Pre::Qwen2,
    ),
    (&["qwen35"], Pre::Qwen35),
    (&["laguna"], Pre::Laguna),
    (&["poro-chat", "bloom", "gpt3-finnish"], Pre::Poro),
    (&["viking"], Pre::Viking),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pre {
    Default,
    Llama3,
    Dbrx,
    ChatGlm,
    Glm4,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
    Gpt2,
    Starcoder,
    Qwen2,
    Qwen35,
    Laguna,
    Poro,
    Viking,
}

const GPT2_RE: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const PORO_RE: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
// Non-ASCII characters in these regexes are written as escapes so that no editor can
// normalize them (U+212A KELVIN SIGN, for one, is canonically equivalent to "K").
const CJK_RE: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";
const DEEPSEEK_LLM_LETTERS: &str = concat!(
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-",
    "\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}",
    "\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}",
    "\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}",
    "\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-",
    "\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}",
    "\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-",
    "\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}",
    "-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}",
    "\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}",
    "\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-",
    "\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-",
    "\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}",
    "-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}",
    "\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
);

impl Pre {
    pub(super) fn from_name(name: &str) -> Option<Pre> {
        PRE_FAMILIES
            .iter()
            .find(|(names, _)| names.contains(&name))
            .map(|&(_, p)| p)
    }

    /// The regex list llama.cpp uses for this pre-tokenizer, as split steps. The GPT-2 and
    /// LLaMA-3/Qwen2 regexes are the hand-coded splitters (llama.cpp dispatches them by string).
    pub(super) fn steps(self) -> Result<Vec<Step>> {
        let p = Step::pattern;
        let llama3 = || Step::Llama3 {
            max_digits: 3,
            marks: false,
        };
        let qwen2 = || Step::Llama3 {
            max_digits: 1,
            marks: false,
        };
        let _ = GPT2_RE;
        Ok(match self {
            Pre::Default => vec![
                p("[\\p{P}\\$\\+<=>\\^~\\|]+")?,
                Step::Gpt2,
                p("\\p{N}+")?,
                p("[0-9][0-9][0-9]")?,
            ],
            Pre::Llama3 | Pre::Dbrx | Pre::ChatGlm | Pre::Glm4 => vec![llama3()],
            Pre::DeepseekLlm => vec![
                p("[\r\n]")?,
                p(DEEPSEEK_LLM_LETTERS)?,
                p("\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+")?,
                p("\\s+$")?,
                p(CJK_RE)?,
                p("\\p{N}+")?,
            ],
            Pre::DeepseekCoder => vec![
                p("[\r\n]")?,
                p("\\s?\\p{L}+")?,
                p("\\s?\\p{P}+")?,
                p(CJK_RE)?,
                p("\\p{N}")?,
            ],
            Pre::Falcon => vec![
                p("[\\p{P}\\$\\+<=>\\^~\\|`]+")?,
                Step::Gpt2,
                p("[0-9][0-9][0-9]")?,
            ],
            Pre::Gpt2 => vec![Step::Gpt2],
            Pre::Starcoder => vec![p("\\p{N}")?, Step::Gpt2],
            Pre::Qwen2 => vec![qwen2()],
            Pre::Qwen35 => vec![Step::Llama3 {
                max_digits: 1,
                marks: true,
            }],
            Pre::Laguna => vec![Step::Newlines, qwen2()],
            Pre::Poro => vec![p(PORO_RE)?],
            Pre::Viking => vec![p(PORO_RE)?, p("\\p{N}")?],
        })
    }
}

pub(super) fn supported_pre_list() -> String {
    PRE_FAMILIES
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}
