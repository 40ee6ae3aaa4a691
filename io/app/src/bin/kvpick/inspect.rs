//! `kvpick inspect URL`: the debug view of a running `kvpick serve`
//! (started with `--debug-endpoints`) as tables in a terminal: its workers,
//! or with `--explain FILE` how it would pick for that request body.

use std::process::ExitCode;

use bytes::Bytes;
use clap::ArgMatches;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub fn run(m: &ArgMatches) -> ExitCode {
    let base = m.get_one::<String>("url").map_or("http://127.0.0.1:9090", String::as_str).trim_end_matches('/');
    let base = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kvpick inspect: {error}");
            return ExitCode::FAILURE;
        }
    };
    let request = match m.get_one::<String>("explain") {
        None => hyper::Request::get(format!("{base}/debug/workers")).body(Full::new(Bytes::new())),
        Some(file) => match std::fs::read(file) {
            Ok(body) => {
                let path = m.get_one::<String>("path").map_or("/v1/chat/completions", String::as_str);
                hyper::Request::post(format!("{base}/debug/explain?path={path}")).body(Full::new(Bytes::from(body)))
            }
            Err(error) => {
                eprintln!("kvpick inspect: {file}: {error}");
                return ExitCode::from(2);
            }
        },
    };
    let request = match request {
        Ok(request) => request,
        Err(error) => {
            eprintln!("kvpick inspect: {base}: {error}");
            return ExitCode::from(2);
        }
    };
    let answer = runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((status, body))
    });
    let (status, body) = match answer {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("kvpick inspect: {base}: {error}");
            return ExitCode::FAILURE;
        }
    };
    if status == hyper::StatusCode::NOT_FOUND {
        eprintln!("kvpick inspect: {base} has no debug view: start kvpick serve with --debug-endpoints");
        return ExitCode::FAILURE;
    }
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(_) => {
            eprintln!("kvpick inspect: {status}: {}", String::from_utf8_lossy(&body));
            return ExitCode::FAILURE;
        }
    };
    if !status.is_success() {
        eprintln!("kvpick inspect: {status}: {}", value["error"].as_str().unwrap_or("(no message)"));
        return ExitCode::FAILURE;
    }
    if m.get_one::<String>("explain").is_some() {
        print!("{}", explain_table(&value));
    } else {
        print!("{}", workers_table(&value));
    }
    ExitCode::SUCCESS
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.3}"),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One row per item of `items` (a JSON array), one column per `(header,
/// key)`; `note` may add to an item's first cell. Columns are as wide as
/// their widest cell, numbers right-aligned.
fn table(items: &Value, columns: &[(&str, &str)], note: impl Fn(&Value) -> Option<String>) -> String {
    let rows: Vec<Vec<String>> = items
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| {
            let mut row: Vec<String> = columns.iter().map(|(_, key)| cell(&item[*key])).collect();
            if let Some(note) = note(item) {
                row[0].push_str(&note);
            }
            row
        })
        .collect();
    let header: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].len()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(header);
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn workers_table(v: &Value) -> String {
    const COLUMNS: [(&str, &str); 10] = [
        ("worker", "worker"),
        ("requests", "requests"),
        ("prefill", "prefill_tokens"),
        ("active blk", "active_blocks"),
        ("cached blk", "cached_blocks"),
        ("speed", "speed_factor"),
        ("ttft scale", "ttft_scale"),
        ("samples", "ttft_samples"),
        ("decode s/tok", "decode_seconds_per_token"),
        ("event lag s", "kv_event_lag_seconds"),
    ];
    let note =
        |w: &Value| w["block_size_mismatch"].as_u64().map(|size| format!(" (events in blocks of {size}: refused)"));
    format!("fleet measured/predicted TTFT: {}\n{}", cell(&v["fleet_ttft_scale"]), table(&v["workers"], &COLUMNS, note))
}

fn explain_table(v: &Value) -> String {
    const COLUMNS: [(&str, &str); 9] = [
        ("worker", "worker"),
        ("cost", "cost"),
        ("overlap blk", "overlap_blocks"),
        ("booked blk", "booked_prefix_blocks"),
        ("uncached tok", "uncached_tokens"),
        ("prefill ahead", "prefill_tokens_booked"),
        ("requests", "requests"),
        ("speed", "speed"),
        ("evicting", "eviction_pressure"),
    ];
    let note = |c: &Value| (c["picked"] == true).then(|| " <- picked".to_owned());
    format!(
        "prompt: {} tokens{}; cost in {}; session's worker: {}\n{}",
        cell(&v["prompt_tokens"]),
        if v["tokenized"] == true { "" } else { " (estimated: not tokenized)" },
        cell(&v["cost_unit"]),
        cell(&v["session_worker"]),
        table(&v["candidates"], &COLUMNS, note)
    )
}
