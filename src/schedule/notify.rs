//! The text of a notification (API.md "Telling the person"): one short message, in the task's
//! language, saying what was not sent, to whom, when and why, and for an expiry that it can be
//! set to a new time. Pure.

use chrono_tz::Tz;

use crate::model::{Lang, NotifyOn};

use super::describe::{duration, local_time, recipient_time};
use super::misfire::Expiry;

/// What a notification is about.
#[derive(Debug, Clone)]
pub struct About<'a> {
    pub event: NotifyOn,
    pub task_id: &'a str,
    pub task_name: Option<&'a str>,
    pub run: u32,
    /// The message given up on (`failed`); `None` for an expired fire.
    pub seq: Option<u32>,
    /// Its recipient (`failed`).
    pub to: Option<&'a str>,
    /// When it was due, as the person told reads it.
    pub due: Due,
    /// Why.
    pub why: Why<'a>,
}

/// Why what a notification is about was not sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Why<'a> {
    /// A message given up on: the channel's last error, passed on as it was given (the
    /// receiver's or the system's words, not herald's).
    Error(&'a str),
    /// A fire expired, for one of herald's own reasons: said in the task's language. `tz`:
    /// where an instant it names (a reminder's event) is read, the schedule's zone.
    Expired(Expiry, Tz),
    /// A fire expired for a reason whose kind the caller does not know (the run's stored
    /// `reason`): in English as it is, in Chinese only that it was missed, never English
    /// inside a Chinese text.
    Other(&'a str),
}

/// `w` in `lang`. The English for an expiry is the run's stored `reason` ([`Expiry::reason`]),
/// but for a reminder's event, named in its zone as the rest of the text names times.
fn why(lang: Lang, w: Why<'_>) -> String {
    match (lang, w) {
        (_, Why::Error(e)) | (Lang::En, Why::Other(e)) => e.to_owned(),
        (Lang::Zh, Why::Other(_)) => "错过了发送时间".to_owned(),
        (Lang::En, Why::Expired(Expiry::EventBegan { event_ms }, tz)) => format!(
            "the event began at {} before its first message could go",
            local_time(event_ms, tz, lang)
        ),
        (Lang::En, Why::Expired(x, _)) => x.reason(),
        (Lang::Zh, Why::Expired(x, tz)) => match x {
            Expiry::Missed { late_ms, grace_ms } => format!(
                "错过发送时间 {}，超过了宽限时间 {}",
                duration(late_ms, lang),
                duration(grace_ms, lang)
            ),
            Expiry::StartedLate { late_ms, grace_ms } => format!(
                "因 herald 停止运行或任务暂停，第一条消息将晚 {} 才能开始发送，超过了宽限时间 {}",
                duration(late_ms, lang),
                duration(grace_ms, lang)
            ),
            Expiry::EventBegan { event_ms } => format!(
                "提醒的事件已于 {}开始，提醒未能在此之前发出",
                local_time(event_ms, tz, lang)
            ),
        },
    }
}

/// When what a notification is about was due, written as the schedule's descriptions write
/// time (`describe/`): in the task's language, with the place its wall time is read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Due {
    /// An instant, in a zone: in recipient time the recipient's own (a message), otherwise
    /// the schedule's (UTC without one).
    At { ms: u64, tz: Tz },
    /// A slot's wall time in recipient time, which each recipient has in their own zone (a
    /// fire of a run that spans the zones): "09:00 (each recipient's local time)".
    Wall(u64),
}

/// The body of the notification.
pub fn body(lang: Lang, a: &About<'_>) -> String {
    let when = match a.due {
        Due::At { ms, tz } => local_time(ms, tz, lang),
        Due::Wall(wall_ms) => recipient_time(wall_ms, lang),
    };
    let why = why(lang, a.why);
    let what = match (lang, a.task_name) {
        (Lang::En, Some(n)) => format!("\"{n}\" (task {}, run {})", a.task_id, a.run),
        (Lang::En, None) => format!("task {}, run {}", a.task_id, a.run),
        (Lang::Zh, Some(n)) => format!("“{n}”（任务 {}，第 {} 次）", a.task_id, a.run),
        (Lang::Zh, None) => format!("任务 {}，第 {} 次", a.task_id, a.run),
    };
    match (lang, a.event) {
        (Lang::En, NotifyOn::Failed) => format!(
            "Your scheduled message {what}, message {} to {}, due {when}, could not be sent: {why}.",
            a.seq.unwrap_or(0) + 1,
            a.to.unwrap_or("?"),
        ),
        (Lang::En, NotifyOn::Expired) => format!(
            "Your scheduled message {what}, due {when}, expired without being sent: {why}. You can set it to a new time."
        ),
        (Lang::Zh, NotifyOn::Failed) => format!(
            "您的定时消息 {what} 的第 {} 条（发给 {}，原定 {when}）未能发出：{why}。",
            a.seq.unwrap_or(0) + 1,
            a.to.unwrap_or("?"),
        ),
        (Lang::Zh, NotifyOn::Expired) => format!(
            "您的定时消息 {what}（原定 {when}）已过期，未发送：{why}。可以为它设置新的时间。"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DstPolicy;
    use crate::schedule::parse_instant;

    #[test]
    fn a_failure_and_an_expiry_in_both_languages() {
        let due = parse_instant("2026-12-02T01:00:00Z", None, DstPolicy::default()).unwrap()[0];
        let mut a = About {
            event: NotifyOn::Failed,
            task_id: "t1",
            task_name: Some("morning"),
            run: 2,
            seq: Some(0),
            to: Some("zhangsan"),
            due: Due::At {
                ms: due,
                tz: "Asia/Shanghai".parse().unwrap(),
            },
            why: Why::Error("HTTP 400"),
        };
        let en = body(Lang::En, &a);
        assert!(
            en.contains("message 1 to zhangsan") && en.contains("HTTP 400"),
            "{en}"
        );
        assert!(
            en.contains("2026-12-02 09:00") && en.contains("Asia/Shanghai"),
            "{en}"
        );
        let zh = body(Lang::Zh, &a);
        assert!(
            zh.contains("发给 zhangsan") && zh.contains("未能发出"),
            "{zh}"
        );
        // Time as the schedule's descriptions write it in Chinese.
        assert!(
            zh.contains("原定 2026年12月2日 09:00（Asia/Shanghai）"),
            "{zh}"
        );
        a.event = NotifyOn::Expired;
        a.seq = None;
        a.to = None;
        a.why = Why::Other("missed by 3s");
        assert!(body(Lang::En, &a).contains("set it to a new time"));
        assert!(body(Lang::Zh, &a).contains("设置新的时间"));
    }

    /// A recipient-time fire is due at its wall time, each recipient's own: said so, not in
    /// UTC (review finding).
    #[test]
    fn a_wall_time_is_each_recipients_local_time() {
        let wall = parse_instant("2026-12-02T09:00:00Z", None, DstPolicy::default()).unwrap()[0];
        let a = About {
            event: NotifyOn::Expired,
            task_id: "t1",
            task_name: None,
            run: 1,
            seq: None,
            to: None,
            due: Due::Wall(wall),
            why: Why::Other("missed"),
        };
        let en = body(Lang::En, &a);
        assert!(
            en.contains("due 2026-12-02 09:00 (each recipient's local time)"),
            "{en}"
        );
        let zh = body(Lang::Zh, &a);
        assert!(
            zh.contains("原定 2026年12月2日 09:00（收件人当地时间）"),
            "{zh}"
        );
    }

    /// Review finding: an expiry of a Chinese task carried its English reason inside the
    /// Chinese text. Every kind of expiry is said in the task's language; the English is the
    /// run's stored reason (the event's time read in the schedule's zone, as the rest).
    #[test]
    fn every_expiry_is_said_in_the_tasks_language() {
        let shanghai: Tz = "Asia/Shanghai".parse().unwrap();
        let event = parse_instant("2026-12-02T01:00:00Z", None, DstPolicy::default()).unwrap()[0];
        let missed = Expiry::Missed {
            late_ms: 20 * 60_000,
            grace_ms: 10 * 60_000,
        };
        let started = Expiry::StartedLate {
            late_ms: 2_500,
            grace_ms: 1_000,
        };
        let began = Expiry::EventBegan { event_ms: event };
        let cases = [
            (
                missed,
                "missed by 20m (more than misfire_grace 10m)",
                "错过发送时间 20分钟，超过了宽限时间 10分钟",
            ),
            (
                started,
                "its first message would have started 2s500ms late, after herald was down or the task paused (more than misfire_grace 1s)",
                "因 herald 停止运行或任务暂停，第一条消息将晚 2秒500毫秒 才能开始发送，超过了宽限时间 1秒",
            ),
            (
                began,
                "the event began at 2026-12-02 09:00 (Asia/Shanghai) before its first message could go",
                "提醒的事件已于 2026年12月2日 09:00（Asia/Shanghai）开始，提醒未能在此之前发出",
            ),
        ];
        for (x, en, zh) in cases {
            let w = Why::Expired(x, shanghai);
            assert_eq!(why(Lang::En, w), en);
            assert_eq!(why(Lang::Zh, w), zh);
            let a = About {
                event: NotifyOn::Expired,
                task_id: "t1",
                task_name: None,
                run: 1,
                seq: None,
                to: None,
                due: Due::At {
                    ms: event,
                    tz: shanghai,
                },
                why: w,
            };
            let body = body(Lang::Zh, &a);
            assert!(body.contains(&format!("未发送：{zh}。")), "{body}");
            // Nothing of the English reason inside the Chinese text.
            assert!(
                !body.contains("missed") && !body.contains("misfire") && !body.contains("event"),
                "{body}"
            );
        }
        // The stored reasons are the English ones, unchanged (the API's `reason`).
        assert_eq!(missed.reason(), cases[0].1);
        assert_eq!(started.reason(), cases[1].1);
        assert_eq!(
            began.reason(),
            "the event began at 2026-12-02T01:00:00Z before its first message could go"
        );
        // A reason of no known kind: in Chinese only that it was missed, never its English.
        assert_eq!(why(Lang::Zh, Why::Other("missed by 3s")), "错过了发送时间");
        assert_eq!(why(Lang::En, Why::Other("missed by 3s")), "missed by 3s");
    }
}
