//! kvpick's settings as an operator gives them: any flags of `kvpick
//! serve` with any values (`--flag=value`, so a value may start with `-`),
//! through clap (`settings::command`, `Values`) and
//! `ServeConfig::from_values`. The input is lines; each line's first byte
//! picks the setting, the rest is its value.
//!
//! Invariants: no panic; a value clap took is the one given, trimmed (an
//! empty one unset); a refused setting is named by the flag that set it,
//! with the value given; a missing one is named by a setting that exists;
//! the same values give the same answer again.

#![no_main]

use kvpick_app::app::settings::{self, SETTINGS, Setting, Values};
use kvpick_app::app::{ConfigError, ServeConfig};
use libfuzzer_sys::fuzz_target;

/// Clap reads each setting's variable when its flag is absent: one set in
/// the fuzzing shell would make a refusal name a variable, not a flag.
static NO_SETTING_IN_ENV: std::sync::OnceLock<()> = std::sync::OnceLock::new();

fuzz_target!(|data: &[u8]| {
    NO_SETTING_IN_ENV.get_or_init(|| {
        if let Some(s) = SETTINGS.iter().find(|s| std::env::var_os(s.var).is_some()) {
            panic!("unset {} before fuzzing: the settings read the environment too", s.var);
        }
    });
    let mut args = vec!["kvpick".to_owned()];
    let mut given: Vec<(&Setting, String)> = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        let Some((&pick, value)) = line.split_first() else { continue };
        let setting = &SETTINGS[usize::from(pick) % SETTINGS.len()];
        let value = String::from_utf8_lossy(value).into_owned();
        args.push(format!("--{}={value}", setting.flag));
        given.push((setting, value));
    }
    // Clap refuses a flag given twice, among others: an error, not a panic.
    let Ok(values) = Values::parse_from(settings::command("kvpick", ""), &args) else { return };
    for (setting, value) in &given {
        let expected = Some(value.trim()).filter(|v| !v.is_empty());
        assert_eq!(values.get(setting.var), expected, "--{}", setting.flag);
    }
    let answer = ServeConfig::from_values(&values);
    match &answer {
        Ok(_) => {}
        Err(ConfigError::Setting(error)) => {
            let (_, value) = given
                .iter()
                .find(|(s, _)| error.name == format!("--{}", s.flag))
                .unwrap_or_else(|| panic!("{error}: named by no flag given"));
            assert_eq!(error.value, value.trim(), "{error}");
        }
        Err(ConfigError::Missing(name, _)) => {
            assert!(SETTINGS.iter().any(|s| *name == s.var || *name == format!("--{}", s.flag)), "missing {name}");
        }
        Err(ConfigError::Other(message)) => assert!(!message.is_empty()),
    }
    assert_eq!(format!("{answer:?}"), format!("{:?}", ServeConfig::from_values(&values)));
});
