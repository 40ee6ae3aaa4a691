//! A model's chat template, rendered as transformers' `apply_chat_template`
//! renders it (which is what vLLM and SGLang call): Jinja with
//! `trim_blocks` and `lstrip_blocks`, `loopcontrols`, no auto-escaping,
//! the `raise_exception` and `strftime_now` globals, transformers' `tojson`
//! (see `pyjson`), Python's string and dict methods, and as variables the
//! messages, `tools`, `documents`, `add_generation_prompt`, the special
//! tokens and the request's `chat_template_kwargs`.
//!
//! Named templates: `tool_use` when the request has tools and the model
//! has one, else `default` (transformers' rule).
//!
//! `continue_final_message`: the rendered prompt is cut right after the
//! final message's text, leaving that message open for the model to
//! continue (transformers' rule: the last occurrence of the text, or of the
//! text stripped of surrounding whitespace).

use chrono::format::{Item, StrftimeItems};
use minijinja::value::Kwargs;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior, Value};

use super::files::{SpecialTokens, Templates};
use super::pyjson;

/// How a message's content reaches the template (vLLM's
/// `--chat-template-content-format`, detected as its `auto` does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// One string: text parts joined with newlines.
    String,
    /// A list of `{"type": "text", "text": …}` parts: the template loops
    /// over the content.
    OpenAi,
}

/// Everything a render needs besides the template.
pub struct ChatInput {
    pub messages: Value,
    pub tools: Option<Value>,
    pub documents: Option<Value>,
    pub add_generation_prompt: bool,
    /// The final message's text when it is to be continued.
    pub continue_final: Option<String>,
    /// `chat_template_kwargs`, in the request's order.
    pub kwargs: Vec<(String, Value)>,
}

/// Variables a request's `chat_template_kwargs` cannot replace (they are
/// the call's own arguments in transformers, a Python `TypeError` there).
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Compiled templates, shared by every request (minijinja environments are
/// `Send + Sync`; rendering takes `&self`).
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names: the default one and the tool one, if any.
    default: Option<String>,
    tool_use: Option<String>,
    pub format: ContentFormat,
    special: Vec<(String, Value)>,
}

impl ChatTemplate {
    /// Compiles `templates`; the error says which template and where it
    /// fails to parse. `None` when the model has no template.
    pub fn new(templates: &Templates, special_tokens: &SpecialTokens) -> Result<Option<ChatTemplate>, String> {
        ChatTemplate::with_clock(templates, special_tokens, None)
    }

    /// As [`ChatTemplate::new`], with `strftime_now` reading `now` instead
    /// of the local clock when given (for comparisons with a renderer run
    /// at another time).
    pub fn with_clock(
        templates: &Templates,
        special_tokens: &SpecialTokens,
        now: Option<chrono::NaiveDateTime>,
    ) -> Result<Option<ChatTemplate>, String> {
        let named: Vec<(String, String)> = match templates {
            Templates::None => return Ok(None),
            Templates::One(source) => vec![("default".into(), source.clone())],
            Templates::Named(list) => list.clone(),
        };
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| format!("configuring the template engine: {e}"))?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson);
        // jinja2's `iterable` is `iter(x)` succeeding: false for None (so
        // `tools is iterable and tools | length > 0` short-circuits on
        // `tools=None`), true for an undefined name; minijinja's own test
        // says true for none.
        env.add_test("iterable", |value: Value| !value.is_none() && (value.is_undefined() || value.try_iter().is_ok()));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String, kwargs: Kwargs| strftime_now(format, kwargs, now));
        let mut format = ContentFormat::String;
        for (name, source) in &named {
            if loops_over_content(source) {
                format = ContentFormat::OpenAi;
            }
            env.add_template_owned(name.clone(), keep_newline_after_raw(source))
                .map_err(|e| format!("chat template {name:?} does not parse: {e:#}"))?;
        }
        let has = |wanted: &str| named.iter().any(|(n, _)| n == wanted).then(|| wanted.to_owned());
        let mut special: Vec<(String, Value)> =
            special_tokens.named.iter().map(|(name, text)| ((*name).to_owned(), Value::from(text.as_str()))).collect();
        if !special_tokens.additional.is_empty() {
            // In transformers' `special_tokens_map` too, when set.
            special.push((
                "additional_special_tokens".into(),
                Value::from_iter(special_tokens.additional.iter().map(|t| Value::from(t.as_str()))),
            ));
        }
        let default = has("default");
        let tool_use = has("tool_use");
        if default.is_none() && tool_use.is_none() {
            return Err("chat_template lists no template named `default` (nor `tool_use`)".into());
        }
        Ok(Some(ChatTemplate { env, default, tool_use, format, special }))
    }

    /// The prompt text, or the template's error (its `raise_exception`
    /// message, or where it failed).
    pub fn render(&self, input: ChatInput) -> Result<String, String> {
        let has_tools = input.tools.as_ref().is_some_and(|t| t.len().unwrap_or(0) > 0);
        let name = match (&self.tool_use, &self.default, has_tools) {
            (Some(tool), _, true) => tool,
            (_, Some(default), _) => default,
            (Some(tool), None, false) => tool,
            (None, None, _) => return Err("no chat template".into()),
        };
        let template = self.env.get_template(name).map_err(|e| e.to_string())?;
        let mut ctx: Vec<(String, Value)> = Vec::with_capacity(self.special.len() + input.kwargs.len() + 4);
        ctx.extend(self.special.iter().cloned());
        ctx.extend(input.kwargs.into_iter().filter(|(k, _)| !RESERVED.contains(&k.as_str())));
        ctx.push(("messages".into(), input.messages));
        ctx.push(("tools".into(), input.tools.unwrap_or(Value::from(()))));
        ctx.push(("documents".into(), input.documents.unwrap_or(Value::from(()))));
        ctx.push(("add_generation_prompt".into(), Value::from(input.add_generation_prompt)));
        // Later entries win, as in a Python dict built the same way.
        let ctx = Value::from_pairs(ctx);
        let rendered = template.render(ctx).map_err(|e| describe(&e))?;
        match input.continue_final {
            None => Ok(rendered),
            Some(text) => cut_after_final(rendered, &text),
        }
    }
}

/// transformers' cut for `continue_final_message`.
fn cut_after_final(rendered: String, text: &str) -> Result<String, String> {
    let end = match rendered.rfind(text) {
        Some(at) if !text.is_empty() => at + text.len(),
        _ => {
            let stripped = text.trim();
            match rendered.rfind(stripped) {
                Some(at) => at + stripped.len(),
                None => return Err("continue_final_message: the final message is not in the rendered prompt".into()),
            }
        }
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// The error as the client should read it: a `raise_exception` message as
/// written, anything else with its kind and location.
fn describe(error: &Error) -> String {
    match (error.kind(), error.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) if detail.starts_with(RAISED) => detail[RAISED.len()..].to_owned(),
        _ => format!("chat template failed: {error:#}"),
    }
}

const RAISED: &str = "raise_exception: ";

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
}

/// `strftime_now(format)`: the local time, formatted. An unknown `%`
/// directive is an error here (chrono would panic on it).
fn strftime_now(format: String, _kwargs: Kwargs, now: Option<chrono::NaiveDateTime>) -> Result<Value, Error> {
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")));
    }
    let now = now.unwrap_or_else(|| chrono::Local::now().naive_local());
    Ok(Value::from(now.format_with_items(items.into_iter()).to_string()))
}

/// The template's block tags, in order: the text between `{%` and `%}`
/// (whitespace-control marks included) and the offset just past the `%}`.
/// A plain scan, not a parse: what the two checks below need.
fn block_tags(source: &str) -> impl Iterator<Item = (&str, usize)> {
    let mut from = 0;
    std::iter::from_fn(move || {
        let open = from + source[from..].find("{%")? + 2;
        let close = open + source[open..].find("%}")?;
        from = close + 2;
        Some((&source[open..close], from))
    })
}

/// jinja2 keeps the newline right after `{% raw %}` even with
/// `trim_blocks` (raw text is verbatim); minijinja trims it like any block
/// tag's. Doubling that newline makes minijinja print the one jinja2 does
/// (Qwen2-VL-style templates put `{% raw %}\n{% endraw %}` after each role).
/// `{% raw -%}` strips it in both, so it is left alone.
fn keep_newline_after_raw(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut copied = 0;
    for (inner, end) in block_tags(source) {
        let is_raw = inner.trim_start_matches(['-', '+']).trim() == "raw" && !inner.ends_with('-');
        if is_raw && source[end..].starts_with('\n') {
            out.push_str(&source[copied..end]);
            out.push('\n');
            copied = end;
        }
    }
    out.push_str(&source[copied..]);
    out
}

/// Whether a `{% for … in … %}` of the template iterates over a message's
/// content (`message['content']`, `message.content`, `m["content"]`): vLLM's
/// `auto` content format then hands the content over as a list of parts.
/// A scan of the block tags rather than vLLM's walk of the parsed template;
/// it agrees on the usual spellings, and the parity sampler catches the rest.
fn loops_over_content(source: &str) -> bool {
    block_tags(source).any(|(inner, _)| {
        let tag = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let Some((_, iterable)) = tag.strip_prefix("for ").and_then(|head| head.split_once(" in ")) else {
            return false;
        };
        let iterable = iterable.split(" if ").next().unwrap_or(iterable).trim();
        let iterable = iterable.split('|').next().unwrap_or(iterable).trim();
        iterable.ends_with("['content']") || iterable.ends_with("[\"content\"]") || iterable.ends_with(".content")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `source` rendered with no messages and nothing else.
    fn render_alone(source: &str) -> Result<String, String> {
        let template = ChatTemplate::new(&Templates::One(source.into()), &SpecialTokens::default())?;
        let template = template.ok_or("no template")?;
        template.render(ChatInput {
            messages: Value::from(Vec::<Value>::new()),
            tools: None,
            documents: None,
            add_generation_prompt: false,
            continue_final: None,
            kwargs: Vec::new(),
        })
    }

    /// What jinja2 3.1 (trim_blocks, lstrip_blocks) renders for each.
    #[test]
    fn raw_blocks_render_as_jinja2_does() {
        let cases = [
            ("a{% raw %}\nb{% endraw %}\nc", "a\nbc"),
            ("a{%- raw %}\nb{% endraw %}c", "a\nbc"),
            ("a{% raw -%}\n  b{% endraw %}c", "abc"),
            ("x{% raw %}\n{% endraw %}y", "x\ny"),
        ];
        for (source, want) in cases {
            assert_eq!(render_alone(source).as_deref(), Ok(want), "{source:?}");
        }
    }

    #[test]
    fn iterable_is_jinja2s() {
        let source = "{{ none is iterable }}{{ nope is iterable }}{{ [1] is iterable }}{{ 'a' is iterable }}{{ 3 is iterable }}{{ {} is iterable }}";
        // jinja2 3.1 renders "FalseTrueTrueTrueFalseTrue".
        assert_eq!(render_alone(source).as_deref(), Ok("FalseTrueTrueTrueFalseTrue"));
    }

    #[test]
    fn content_loops_are_found() {
        assert!(loops_over_content(
            "{% for m in messages %}{%- for p in m['content'] -%}{{ p }}{% endfor %}{% endfor %}"
        ));
        assert!(loops_over_content("{% for p in message.content if p.type == 'text' %}{% endfor %}"));
        assert!(loops_over_content("{%+ for p in message[\"content\"] | reverse %}{% endfor %}"));
        assert!(!loops_over_content("{% for m in messages %}{{ m['content'] }}{% endfor %}"));
        assert!(!loops_over_content("{% if x %}{% for content in contents %}{% endfor %}{% endif %}"));
        assert!(!loops_over_content("{% for"));
    }

    #[test]
    fn strftime_now_refuses_bad_formats() {
        let none = || Kwargs::from_iter(std::iter::empty::<(&str, Value)>());
        let ok = strftime_now("%d %b %Y".into(), none(), None);
        assert!(ok.is_ok_and(|v| v.as_str().is_some_and(|s| s.len() >= 10)));
        let fixed = chrono::NaiveDate::from_ymd_opt(2024, 7, 26).and_then(|d| d.and_hms_opt(9, 5, 0));
        let ok = strftime_now("%d %b %Y %H:%M".into(), none(), fixed);
        assert_eq!(ok.ok().as_ref().and_then(|v| v.as_str()), Some("26 Jul 2024 09:05"));
        let bad = strftime_now("%Q".into(), none(), None);
        assert!(bad.is_err());
    }
}
