//! `kvpick-check-templates CASES.jsonl`: how many real chat templates the
//! in-process tokenizer renders exactly as transformers does.
//!
//! Each line of the file is one render made by transformers'
//! `render_jinja_template` (a corpus made outside the repository, from
//! public templates such as vLLM's `examples/*.jinja`, which are not
//! committed here): `{"template_name", "template", "context": {messages,
//! tools, documents, add_generation_prompt, bos_token, eos_token},
//! "now": "2025-01-15T10:30:00", "expected": "…"}` or `"error": "…"` when
//! transformers raised. The same template and context go through kvpick's
//! renderer with `strftime_now` pinned to `now`; the report counts exact
//! matches, renders that differ (with the first differing character),
//! errors on both sides, and one-sided errors, per case and per template.

use std::process::ExitCode;

use kvpick_perf::report::Table;
use kvpick_router::tokenizer::local::files::{SpecialTokens, Templates};
use kvpick_router::tokenizer::local::template::{ChatInput, ChatTemplate};
use minijinja::Value;
use serde_json::Value as Json;

const BIN: &str = "kvpick-check-templates";

#[derive(Default)]
struct Counts {
    same: usize,
    differ: usize,
    both_failed: usize,
    only_we_failed: usize,
    only_they_failed: usize,
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: {BIN} CASES.jsonl");
        return ExitCode::FAILURE;
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut counts = Counts::default();
    let mut templates: std::collections::BTreeMap<String, bool> = Default::default();
    let mut details = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let case: Json = match serde_json::from_str(line) {
            Ok(case) => case,
            Err(e) => {
                eprintln!("line {}: {e}", n + 1);
                return ExitCode::FAILURE;
            }
        };
        let name =
            format!("{} / {}", case["template_name"].as_str().unwrap_or("?"), case["case"].as_str().unwrap_or("?"));
        // The context again, keys in the file's order (tojson shows it).
        let ordered: Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(e) => {
                eprintln!("line {}: {e}", n + 1);
                return ExitCode::FAILURE;
            }
        };
        let ours = render(&case, &ordered.get_attr("context").unwrap_or_default());
        let ok = templates.entry(case["template_name"].as_str().unwrap_or("?").to_owned()).or_insert(true);
        match (ours, case.get("expected").and_then(Json::as_str), case.get("error")) {
            (Ok(text), Some(expected), _) if text == expected => counts.same += 1,
            (Ok(text), Some(expected), _) => {
                counts.differ += 1;
                *ok = false;
                let at = text.chars().zip(expected.chars()).take_while(|(a, b)| a == b).count();
                let around = |s: &str| s.chars().skip(at.saturating_sub(20)).take(50).collect::<String>();
                details.push(format!(
                    "- {name}: differs at character {at}: ours {:?}, transformers {:?}",
                    around(&text),
                    around(expected)
                ));
            }
            (Err(_), None, Some(_)) => counts.both_failed += 1,
            (Err(error), Some(_), _) => {
                counts.only_we_failed += 1;
                *ok = false;
                details.push(format!("- {name}: only kvpick failed: {}", error.lines().next().unwrap_or("")));
            }
            (Ok(_), None, theirs) => {
                counts.only_they_failed += 1;
                *ok = false;
                details.push(format!(
                    "- {name}: only transformers failed: {}",
                    theirs.map(Json::to_string).unwrap_or_default()
                ));
            }
            (Err(_), None, None) => counts.both_failed += 1,
        }
    }
    let cases = counts.same + counts.differ + counts.both_failed + counts.only_we_failed + counts.only_they_failed;
    let clean = templates.values().filter(|ok| **ok).count();
    let mut table =
        Table::new(format!("Chat templates rendered by kvpick against transformers ({path})"), &["outcome", "cases"]);
    for (label, n) in [
        ("identical text", counts.same),
        ("both raised an error", counts.both_failed),
        ("text differs", counts.differ),
        ("only kvpick raised", counts.only_we_failed),
        ("only transformers raised", counts.only_they_failed),
    ] {
        table.row([label.to_string(), n.to_string()]);
    }
    table.note(format!(
        "- {cases} cases of {} templates; {clean} templates agree on every case ({:.1}% of cases agree)",
        templates.len(),
        100.0 * (counts.same + counts.both_failed) as f64 / cases.max(1) as f64
    ));
    for detail in details {
        table.note(detail);
    }
    println!("{table}");
    ExitCode::SUCCESS
}

/// kvpick's render of one case (`ordered`: its context in file order).
fn render(case: &Json, ordered: &Value) -> Result<String, String> {
    let source = case["template"].as_str().ok_or("no template")?;
    let context = &case["context"];
    let token = |name: &'static str| context[name].as_str().map(|t| (name, t.to_owned()));
    let special = SpecialTokens {
        named: [token("bos_token"), token("eos_token")].into_iter().flatten().collect(),
        additional: vec![],
    };
    let now = case["now"].as_str().and_then(|t| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S").ok());
    let template = ChatTemplate::with_clock(&Templates::One(source.to_owned()), &special, now)?.ok_or("no template")?;
    let value = |key: &str| -> Result<Option<Value>, String> {
        let v = ordered.get_attr(key).map_err(|e| e.to_string())?;
        Ok((!v.is_none() && !v.is_undefined()).then_some(v))
    };
    let input = ChatInput {
        messages: value("messages")?.unwrap_or_else(|| Value::from(Vec::<Value>::new())),
        tools: value("tools")?,
        documents: value("documents")?,
        add_generation_prompt: context["add_generation_prompt"].as_bool().unwrap_or(false),
        continue_final: None,
        kwargs: Vec::new(),
    };
    template.render(input)
}
