//! The text of a notification (API.md "Telling the person"): one short message, in the task's
//! language, saying what was not sent, to whom, when and why, and for an expiry that it can be
//! set to a new time. Pure.

use chrono_tz::Tz;

use crate::model::{Lang, NotifyOn};

use super::describe::{local_time, recipient_time};

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
    /// Why: the last error, or the expiry's reason.
    pub why: &'a str,
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
    let what = match (lang, a.task_name) {
        (Lang::En, Some(n)) => format!("\"{n}\" (task {}, run {})", a.task_id, a.run),
        (Lang::En, None) => format!("task {}, run {}", a.task_id, a.run),
        (Lang::Zh, Some(n)) => format!("“{n}”（任务 {}，第 {} 次）", a.task_id, a.run),
        (Lang::Zh, None) => format!("任务 {}，第 {} 次", a.task_id, a.run),
    };
    match (lang, a.event) {
        (Lang::En, NotifyOn::Failed) => format!(
            "Your scheduled message {what}, message {} to {}, due {when}, could not be sent: {}.",
            a.seq.unwrap_or(0) + 1,
            a.to.unwrap_or("?"),
            a.why
        ),
        (Lang::En, NotifyOn::Expired) => format!(
            "Your scheduled message {what}, due {when}, expired without being sent: {}. You can set it to a new time.",
            a.why
        ),
        (Lang::Zh, NotifyOn::Failed) => format!(
            "您的定时消息 {what} 的第 {} 条（发给 {}，原定 {when}）未能发出：{}。",
            a.seq.unwrap_or(0) + 1,
            a.to.unwrap_or("?"),
            a.why
        ),
        (Lang::Zh, NotifyOn::Expired) => format!(
            "您的定时消息 {what}（原定 {when}）已过期，未发送：{}。可以为它设置新的时间。",
            a.why
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
            why: "HTTP 400",
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
        a.why = "missed by 3s";
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
            why: "missed",
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
}
