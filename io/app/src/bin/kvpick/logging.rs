//! Logs on stderr: human-readable lines by default, JSON lines with
//! `--log-format json`; the filter is `tracing_subscriber`'s target list
//! (`info`, `kvpick_app=debug,info`), parsed without regex.

use kvpick_app::app::LogFormat;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

pub fn init(format: LogFormat, filter: &str) -> Result<(), String> {
    let targets: Targets = filter.parse().map_err(|e| {
        format!(
            "KVPICK_LOG={filter:?} is not valid: expected a level or target=level list, e.g. info,kvpick_app=debug ({e})"
        )
    })?;
    let registry = tracing_subscriber::registry().with(targets);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => registry.with(fmt.with_ansi(false)).try_init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).try_init(),
    };
    result.map_err(|e| format!("could not install the logger: {e}"))
}
