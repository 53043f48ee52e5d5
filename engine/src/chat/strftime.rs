//! `strftime_now(format)`, the global HF gives templates (Llama 3.x puts today's date in
//! the system prompt). HF calls `datetime.now().strftime(format)` in local time; std has no
//! time zone database, so this renders UTC — the date can differ from HF's near midnight.
//! Only the C-locale directives glibc documents are supported, which covers what chat
//! templates use; an unknown directive is copied through, as glibc does.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A broken-down UTC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DateTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yday: u32,
}

impl DateTime {
    /// The UTC calendar time of `secs` seconds since the Unix epoch.
    pub fn from_unix(secs: i64) -> DateTime {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let jan1 = days_from_civil(year, 1, 1);
        DateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (index 3).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: (days - jan1) as u32 + 1,
        }
    }

    pub fn now_utc() -> DateTime {
        let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        DateTime::from_unix(secs)
    }
}

/// Howard Hinnant's `civil_from_days`: proleptic Gregorian date of a day number.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `t` per a C `strftime` format string. `%-d` style (glibc: no padding) is
/// honoured because templates use it for "26 July 2024".
pub(crate) fn strftime(format: &str, t: &DateTime) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            if no_pad {
                out.push('-');
            }
            break;
        };
        let num = |v: i64, width: usize| {
            if no_pad {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        let piece = match d {
            'Y' => t.year.to_string(),
            'y' => num(t.year.rem_euclid(100), 2),
            'C' => num(t.year.div_euclid(100), 2),
            'm' => num(t.month.into(), 2),
            'd' => num(t.day.into(), 2),
            'e' => {
                if no_pad {
                    t.day.to_string()
                } else {
                    format!("{:2}", t.day)
                }
            }
            'H' => num(t.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'M' => num(t.minute.into(), 2),
            'S' => num(t.second.into(), 2),
            'j' => num(t.yday.into(), 3),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.into(),
            'B' => MONTHS[t.month as usize - 1].into(),
            'b' | 'h' => MONTHS[t.month as usize - 1][..3].into(),
            'A' => DAYS[t.weekday as usize].into(),
            'a' => DAYS[t.weekday as usize][..3].into(),
            'u' => (t.weekday + 1).to_string(),
            'w' => ((t.weekday + 1) % 7).to_string(),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'D' | 'x' => format!("{:02}/{:02}/{:02}", t.month, t.day, t.year.rem_euclid(100)),
            'T' | 'X' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'R' => format!("{:02}:{:02}", t.hour, t.minute),
            'c' => format!(
                "{} {} {:2} {:02}:{:02}:{:02} {}",
                &DAYS[t.weekday as usize][..3],
                &MONTHS[t.month as usize - 1][..3],
                t.day,
                t.hour,
                t.minute,
                t.second,
                t.year
            ),
            'Z' => "UTC".into(),
            'z' => "+0000".into(),
            'n' => "\n".into(),
            't' => "\t".into(),
            '%' => "%".into(),
            other => {
                if no_pad {
                    format!("%-{other}")
                } else {
                    format!("%{other}")
                }
            }
        };
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_and_directives() {
        // 2024-07-26 14:05:09 UTC, a Friday, day 208 of a leap year.
        let t = DateTime::from_unix(1_722_002_709);
        assert_eq!(
            (t.year, t.month, t.day, t.hour, t.minute, t.second),
            (2024, 7, 26, 14, 5, 9)
        );
        assert_eq!(strftime("%d %b %Y", &t), "26 Jul 2024");
        assert_eq!(strftime("%-d %B %Y", &t), "26 July 2024");
        assert_eq!(strftime("%A %j %I:%M %p %%", &t), "Friday 208 02:05 PM %");
        assert_eq!(strftime("%F %T %Q", &t), "2024-07-26 14:05:09 %Q");
        let epoch = DateTime::from_unix(0);
        assert_eq!(strftime("%c", &epoch), "Thu Jan  1 00:00:00 1970");
        let before = DateTime::from_unix(-1);
        assert_eq!(strftime("%F %T", &before), "1969-12-31 23:59:59");
    }
}
