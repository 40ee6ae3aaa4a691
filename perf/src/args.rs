//! Command-line flags every benchmark accepts.

/// Flags shared by the benchmarks. Absent numbers mean "the benchmark's
/// default for this mode".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Args {
    /// Smaller population and shorter time budgets: a smoke test in seconds.
    pub quick: bool,
    /// Stored (block, worker) entries in the population.
    pub entries: Option<u64>,
    /// Workers holding the population.
    pub workers: Option<u32>,
    /// Seed of every random choice (the same seed builds the same population).
    pub seed: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `--help` was asked for; the caller prints [`usage`].
    Help,
    Invalid(String),
}

/// A binary's parsed options, or the exit code once `--help` printed
/// `usage` (0) or a bad flag printed why and `usage` (2).
pub fn options_or_exit<T>(bin: &str, usage: &str, parsed: Result<T, ArgsError>) -> Result<T, std::process::ExitCode> {
    match parsed {
        Ok(options) => Ok(options),
        Err(ArgsError::Help) => {
            print!("{usage}");
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("{bin}: {message}\n\n{usage}");
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// Command-line words read as flags, `--name value` or `--name=value`:
/// the one reading every benchmark's parser shares.
pub struct Flags<I> {
    words: I,
}

/// One flag as written: its name and, for `--name=value`, the value.
pub struct Flag {
    pub name: String,
    inline: Option<String>,
}

impl Flag {
    /// The word as it was written, for a parser that takes its own flags
    /// out and hands the rest on.
    pub fn into_word(self) -> String {
        match self.inline {
            Some(value) => format!("{}={value}", self.name),
            None => self.name,
        }
    }
}

impl<I: Iterator<Item = String>> Flags<I> {
    pub fn new(words: impl IntoIterator<IntoIter = I>) -> Self {
        Flags { words: words.into_iter() }
    }

    /// The next flag. Only a word starting with `--` is split at `=`.
    pub fn next_flag(&mut self) -> Option<Flag> {
        let word = self.words.next()?;
        Some(match word.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                Flag { name: name.to_owned(), inline: Some(value.to_owned()) }
            }
            _ => Flag { name: word, inline: None },
        })
    }

    /// `flag`'s value: the inline one, else the next word.
    pub fn value(&mut self, flag: &Flag) -> Result<String, ArgsError> {
        flag.inline
            .clone()
            .or_else(|| self.words.next())
            .ok_or_else(|| ArgsError::Invalid(format!("{} needs a value", flag.name)))
    }
}

/// A round-trip benchmark's time budget: a warm-up, then the measured time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeBudget {
    pub warmup: std::time::Duration,
    pub time: std::time::Duration,
}

/// Progress lines on stderr, prefixed with the benchmark's name (stdout
/// carries only the report).
#[macro_export]
macro_rules! progress {
    ($bin:expr, $($arg:tt)*) => { eprintln!("[{}] {}", $bin, format!($($arg)*)) };
}

/// The flags, or the process ends: `--help` prints the usage (and `note`,
/// what applies to this benchmark) and exits 0; a bad flag prints why and
/// the usage and exits 2.
pub fn parse_or_exit(bin: &str, note: &str) -> Args {
    match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(ArgsError::Help) => {
            println!("{}{note}", usage(bin));
            std::process::exit(0);
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("{message}\n\n{}", usage(bin));
            std::process::exit(2);
        }
    }
}

/// What `--help` prints.
pub fn usage(bin: &str) -> String {
    format!(
        "usage: {bin} [--quick] [--entries N] [--workers N] [--seed N]\n\
         \n  --quick        small population and short budgets (smoke test)\
         \n  --entries N    stored (block, worker) entries in the population\
         \n  --workers N    workers holding them\
         \n  --seed N       seed of the synthetic workload\n"
    )
}

impl Args {
    /// Parses flags (without the program name). `--name value` and
    /// `--name=value` are both accepted.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, ArgsError> {
        let mut out = Args::default();
        let mut flags = Flags::new(args);
        while let Some(flag) = flags.next_flag() {
            let name = &flag.name;
            match name.as_str() {
                "-h" | "--help" => return Err(ArgsError::Help),
                "--quick" => out.quick = true,
                "--entries" => out.entries = Some(number(name, &flags.value(&flag)?)?),
                "--workers" => {
                    let workers = number(name, &flags.value(&flag)?)?;
                    out.workers =
                        Some(u32::try_from(workers).map_err(|_| ArgsError::Invalid(format!("{name}: too large")))?);
                }
                "--seed" => out.seed = Some(number(name, &flags.value(&flag)?)?),
                // `cargo bench` passes this to every bench binary.
                "--bench" => {}
                other => return Err(ArgsError::Invalid(format!("unknown flag {other}"))),
            }
        }
        if out.entries == Some(0) || out.workers == Some(0) {
            return Err(ArgsError::Invalid("--entries and --workers must be at least 1".into()));
        }
        Ok(out)
    }
}

/// A count, with `_` separators and `k`/`M` suffixes allowed (`1_000_000`, `1M`).
pub fn parse_count(text: &str) -> Option<u64> {
    let clean = text.replace('_', "");
    let (digits, scale) = match clean.strip_suffix(['k', 'K']) {
        Some(digits) => (digits, 1_000),
        None => match clean.strip_suffix(['m', 'M']) {
            Some(digits) => (digits, 1_000_000),
            None => (clean.as_str(), 1),
        },
    };
    digits.parse::<u64>().ok().and_then(|n| n.checked_mul(scale))
}

fn number(name: &str, text: &str) -> Result<u64, ArgsError> {
    parse_count(text).ok_or_else(|| ArgsError::Invalid(format!("{name}: {text:?} is not a count")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags_in_both_forms() {
        let args = parse(&["--quick", "--entries", "2M", "--workers=128", "--seed", "1_000"]).expect("valid flags");
        assert_eq!(args, Args { quick: true, entries: Some(2_000_000), workers: Some(128), seed: Some(1000) });
        assert_eq!(parse(&["--entries=250k"]).map(|a| a.entries), Ok(Some(250_000)));
    }

    #[test]
    fn a_flag_passed_on_is_the_word_as_written() {
        let mut flags = Flags::new(["--entries=2M", "--quick", "7", "a=b"].map(String::from));
        let words: Vec<String> = std::iter::from_fn(|| flags.next_flag()).map(Flag::into_word).collect();
        assert_eq!(words, ["--entries=2M", "--quick", "7", "a=b"]);
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(matches!(parse(&["--entries"]), Err(ArgsError::Invalid(_))));
        assert!(matches!(parse(&["--entries", "x"]), Err(ArgsError::Invalid(_))));
        assert!(matches!(parse(&["--workers", "0"]), Err(ArgsError::Invalid(_))));
        assert!(matches!(parse(&["--frobnicate"]), Err(ArgsError::Invalid(_))));
        assert_eq!(parse(&["--help"]), Err(ArgsError::Help));
    }
}
