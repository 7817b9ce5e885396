//! The registered gVisor: its version (from `runsc --version` of the binary the engine runs), the
//! platform it runs sandboxes on, and its age, judged from the release date its version carries.
//! Parsing and judging are pure; [`describe`] runs the binary.

use std::time::Duration;

/// Past this many months since its release, the doctor warns that runsc is old.
pub const STALE_MONTHS: u32 = 18;
/// The first release whose default platform is systrap (gVisor made it the default in mid-2023;
/// earlier releases default to ptrace).
const SYSTRAP_DEFAULT_SINCE: Date = Date {
    year: 2023,
    month: 6,
    day: 1,
};
/// The release of bookworm-backports' runsc (`0.0~20240729.0`), the newest Debian offers bookworm.
const BOOKWORM_BACKPORTS: Date = Date {
    year: 2024,
    month: 7,
    day: 29,
};
/// How long `runsc --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A calendar date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date {
    pub year: i32,
    pub month: u32,
    pub day: u32,
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

impl Date {
    /// A date that exists, or `None`.
    pub fn new(year: i32, month: u32, day: u32) -> Option<Date> {
        ((1..=12).contains(&month) && day >= 1 && day <= days_in_month(year, month))
            .then_some(Date { year, month, day })
    }

    /// The same day `months` later, or the month's last day where it has no such day.
    fn plus_months(self, months: u32) -> Date {
        let index = self.year * 12 + (self.month as i32 - 1) + months as i32;
        let (year, month) = (index.div_euclid(12), index.rem_euclid(12) as u32 + 1);
        Date {
            year,
            month,
            day: self.day.min(days_in_month(year, month)),
        }
    }

    /// The date `days` days after 1970-01-01 (the proleptic Gregorian calendar).
    pub fn from_unix_days(days: i64) -> Date {
        // Count in 400-year eras from 0000-03-01, so that a leap day ends each year.
        let shifted = days + 719_468;
        let era = shifted.div_euclid(146_097);
        let day_of_era = shifted.rem_euclid(146_097);
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_from_march = (5 * day_of_year + 2) / 153;
        let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
        let month = if month_from_march < 10 {
            month_from_march + 3
        } else {
            month_from_march - 9
        } as u32;
        let year = (year_of_era + era * 400 + i64::from(month <= 2)) as i32;
        Date { year, month, day }
    }

    /// Today, by this machine's clock (UTC).
    pub fn today() -> Date {
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Date::from_unix_days((seconds / 86_400) as i64)
    }
}

/// A runsc version with the release date it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// As runsc says it: `0.0~20240729.0` (Debian's packages) or `release-20240729.0` (gVisor's).
    pub text: String,
    pub released: Date,
}

/// The version in `runsc --version`'s output (or a bare version), when it is one of the two forms
/// that carry a release date; `None` for any other.
pub fn parse_version(output: &str) -> Option<Version> {
    let line = output.lines().next()?.trim();
    let text = line.strip_prefix("runsc version ").unwrap_or(line).trim();
    let dated = text
        .strip_prefix("0.0~")
        .or_else(|| text.strip_prefix("release-"))?;
    let (date, rest) = dated.split_once('.')?;
    // The release's number, then perhaps a packager's suffix (`+ds1`, `-2`).
    let number_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let suffix_ok = rest[number_end..]
        .chars()
        .next()
        .is_none_or(|c| matches!(c, '+' | '-' | '~'));
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) || number_end == 0 {
        return None;
    }
    if !suffix_ok {
        return None;
    }
    let released = Date::new(
        date[..4].parse().ok()?,
        date[4..6].parse().ok()?,
        date[6..].parse().ok()?,
    )?;
    Some(Version {
        text: text.to_string(),
        released,
    })
}

/// The platform runsc runs sandboxes on, and why that one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `systrap`, `ptrace`, `kvm`; `None` when neither the arguments nor the version tell.
    pub name: Option<String>,
    pub why: String,
}

/// The platform named by the runtime's arguments (`--platform=X`, `--platform X`, one dash or
/// two, as Go's flags take them), else runsc's default for a release of that date.
pub fn platform(released: Option<Date>, runtime_args: &[String]) -> Platform {
    let mut args = runtime_args.iter();
    while let Some(arg) = args.next() {
        let flag = arg.trim_start_matches('-');
        if arg.starts_with('-') {
            if let Some(value) = flag.strip_prefix("platform=") {
                return named(value);
            }
            if flag == "platform" {
                if let Some(value) = args.next() {
                    return named(value);
                }
            }
        }
    }
    match released {
        Some(date) if date >= SYSTRAP_DEFAULT_SINCE => Platform {
            name: Some("systrap".into()),
            why: "runsc's default since its 2023-06 releases".into(),
        },
        Some(_) => Platform {
            name: Some("ptrace".into()),
            why: "runsc's default before its 2023-06 releases".into(),
        },
        None => Platform {
            name: None,
            why: "runsc's default, unknown for this version".into(),
        },
    }
}

fn named(value: &str) -> Platform {
    Platform {
        name: Some(value.to_string()),
        why: "named by the engine's runtimeArgs".into(),
    }
}

/// How old a release is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Age {
    /// Whole months since the release.
    pub months: u32,
    /// More than [`STALE_MONTHS`] months old.
    pub stale: bool,
}

/// The age of a release on `today`: stale from the day after its date plus 18 months.
pub fn age(released: Date, today: Date) -> Age {
    let mut months = (today.year - released.year) * 12 + today.month as i32 - released.month as i32;
    if today.day < released.day {
        months -= 1;
    }
    Age {
        months: months.max(0) as u32,
        stale: today > released.plus_months(STALE_MONTHS),
    }
}

/// How to get a newer runsc than one released on `released`, for a machine running the given
/// Debian-like release (`ID`, `VERSION_CODENAME` of its os-release), when known.
pub fn how_to_update(release: Option<(&str, &str)>, released: Date) -> String {
    const OWN_CHANNEL: &str = "or gVisor's own release channel \
        (https://gvisor.dev/docs/user_guide/install/) on machines that reach it";
    match release {
        Some(("debian", "bookworm")) if released >= BOOKWORM_BACKPORTS => format!(
            "this is already the newest runsc Debian offers bookworm (bookworm-backports'): \
             newer ones come with Debian 13 (trixie) and later, {OWN_CHANNEL}"
        ),
        Some(("debian", "bookworm")) => format!(
            "update it from bookworm-backports (0.0~20240729.0 there): sudo bash \
             scripts/runsc.sh or sudo python-code-sandbox setup --gvisor adds that source, \
             pinned to runsc alone, and installs it; {OWN_CHANNEL}"
        ),
        Some((id, codename)) if !codename.is_empty() => format!(
            "update it: the distribution's runsc package ({id} {codename}'s, or a newer \
             release's; sudo python-code-sandbox setup --gvisor installs the newest apt \
             offers), {OWN_CHANNEL}"
        ),
        _ => format!(
            "update it: the distribution's runsc package (on Debian bookworm from \
             bookworm-backports; trixie and later carry a newer one), {OWN_CHANNEL}"
        ),
    }
}

/// `ID` and `VERSION_CODENAME` of an os-release file's text.
pub fn os_release(text: &str) -> Option<(String, String)> {
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let value = line.strip_prefix(key)?.strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_string())
        })
    };
    Some((field("ID")?, field("VERSION_CODENAME").unwrap_or_default()))
}

/// What `runsc --version` of `binary` says: its output, or why it could not be run.
pub async fn run_version(binary: &str) -> Result<String, String> {
    let command = tokio::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(VERSION_TIMEOUT, command).await {
        Err(_) => Err(format!(
            "`{binary} --version` did not answer within {}s",
            VERSION_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("cannot run `{binary} --version`: {e}")),
        Ok(Ok(out)) if !out.status.success() => Err(format!(
            "`{binary} --version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(Ok(out)) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date(year: i32, month: u32, day: u32) -> Date {
        Date::new(year, month, day).expect("a real date")
    }

    #[test]
    fn both_version_forms_give_their_release_date() {
        let debian =
            parse_version("runsc version 0.0~20221219.0\nspec: 1.0.2-dev\n").expect("debian");
        assert_eq!(debian.text, "0.0~20221219.0");
        assert_eq!(debian.released, date(2022, 12, 19));
        let upstream =
            parse_version("runsc version release-20240729.0\nspec: 1.1.0\n").expect("gVisor's");
        assert_eq!(upstream.text, "release-20240729.0");
        assert_eq!(upstream.released, date(2024, 7, 29));
        assert_eq!(
            parse_version("0.0~20240729.0").map(|v| v.released),
            Some(date(2024, 7, 29)),
            "a bare version"
        );
        assert_eq!(
            parse_version("0.0~20221219.0+ds1").map(|v| v.released),
            Some(date(2022, 12, 19)),
            "a packager's suffix"
        );
    }

    #[test]
    fn unknown_forms_give_no_date() {
        for text in [
            "",
            "runsc version",
            "runsc version 1.2.3",
            "runsc version 20240729.0",
            "runsc version 0.0~2024072.0",
            "runsc version 0.0~20241329.0",
            "runsc version 0.0~20230229.0",
            "runsc version release-20240729",
            "runsc version release-20240729.x",
            "runsc version release-2024-07-29.0",
            "runsc version google-123456",
        ] {
            assert_eq!(parse_version(text), None, "{text:?}");
        }
    }

    #[test]
    fn the_platform_is_named_by_the_arguments_else_the_versions_default() {
        let none: Vec<String> = Vec::new();
        assert_eq!(
            platform(Some(date(2022, 12, 19)), &none).name.as_deref(),
            Some("ptrace")
        );
        assert_eq!(
            platform(Some(date(2023, 5, 31)), &none).name.as_deref(),
            Some("ptrace")
        );
        assert_eq!(
            platform(Some(date(2023, 6, 1)), &none).name.as_deref(),
            Some("systrap")
        );
        assert_eq!(
            platform(Some(date(2024, 7, 29)), &none).name.as_deref(),
            Some("systrap")
        );
        assert_eq!(platform(None, &none).name, None);
        let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let named = platform(
            Some(date(2024, 7, 29)),
            &args(&["--network=none", "--platform=ptrace"]),
        );
        assert_eq!(named.name.as_deref(), Some("ptrace"));
        assert!(named.why.contains("runtimeArgs"));
        assert_eq!(
            platform(None, &args(&["-platform", "kvm"])).name.as_deref(),
            Some("kvm")
        );
        assert_eq!(
            platform(Some(date(2022, 1, 1)), &args(&["--network=none"]))
                .name
                .as_deref(),
            Some("ptrace")
        );
    }

    #[test]
    fn a_release_is_stale_past_eighteen_months() {
        let released = date(2022, 12, 19);
        let on = |y, m, d| age(released, date(y, m, d));
        assert_eq!(
            on(2022, 12, 19),
            Age {
                months: 0,
                stale: false
            }
        );
        assert_eq!(
            on(2024, 6, 18),
            Age {
                months: 17,
                stale: false
            }
        );
        assert_eq!(
            on(2024, 6, 19),
            Age {
                months: 18,
                stale: false
            },
            "18 months to the day"
        );
        assert_eq!(
            on(2024, 6, 20),
            Age {
                months: 18,
                stale: true
            },
            "the day after"
        );
        assert_eq!(on(2025, 5, 20).months, 29);
        assert!(on(2025, 5, 20).stale);
        // A release on a month's 31st: 18 months later is a month's last day.
        let late = date(2023, 8, 31);
        assert!(!age(late, date(2025, 2, 28)).stale);
        assert!(age(late, date(2025, 3, 1)).stale);
        // A clock behind the release: not stale, no negative age.
        assert_eq!(
            age(released, date(2020, 1, 1)),
            Age {
                months: 0,
                stale: false
            }
        );
    }

    #[test]
    fn unix_days_become_calendar_dates() {
        assert_eq!(Date::from_unix_days(0), date(1970, 1, 1));
        assert_eq!(Date::from_unix_days(59), date(1970, 3, 1));
        assert_eq!(Date::from_unix_days(11_016), date(2000, 2, 29));
        assert_eq!(Date::from_unix_days(19_345), date(2022, 12, 19));
        assert_eq!(Date::from_unix_days(19_933), date(2024, 7, 29));
        assert_eq!(Date::from_unix_days(-1), date(1969, 12, 31));
    }

    #[test]
    fn the_update_advice_names_the_way_for_the_release() {
        let old = date(2022, 12, 19);
        let bookworm = how_to_update(Some(("debian", "bookworm")), old);
        assert!(bookworm.contains("from bookworm-backports"), "{bookworm}");
        assert!(bookworm.contains("setup --gvisor"), "{bookworm}");
        assert!(bookworm.contains("gvisor.dev"), "{bookworm}");
        let backported = how_to_update(Some(("debian", "bookworm")), date(2024, 7, 29));
        assert!(
            backported.contains("already the newest") && backported.contains("trixie"),
            "{backported}"
        );
        assert!(backported.contains("gvisor.dev"), "{backported}");
        let trixie = how_to_update(Some(("debian", "trixie")), old);
        assert!(
            trixie.contains("trixie") && !trixie.contains("backports"),
            "{trixie}"
        );
        let unknown = how_to_update(None, old);
        assert!(unknown.contains("bookworm-backports") && unknown.contains("gvisor.dev"));
        assert_eq!(
            os_release("PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n"),
            Some(("debian".to_string(), "bookworm".to_string()))
        );
        assert_eq!(
            os_release("ID=\"ubuntu\"\n"),
            Some(("ubuntu".to_string(), String::new()))
        );
        assert_eq!(os_release("NAME=x\n"), None);
    }
}
