//! The languages herald writes its texts for people in (schedule descriptions, relative
//! times): English, the default, and Chinese.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum Lang {
    #[default]
    En,
    Zh,
}

impl Lang {
    /// The names a task's `lang` field and `?lang=` take.
    pub const NAMES: [(&'static str, Lang); 2] = [("en", Lang::En), ("zh", Lang::Zh)];

    pub fn as_str(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
        }
    }

    /// Exactly `en` or `zh` (the task's field).
    pub fn parse(s: &str) -> Option<Lang> {
        Lang::NAMES.iter().find(|(n, _)| *n == s).map(|(_, l)| *l)
    }

    /// A language tag or a POSIX locale by its primary part, any case: `zh-CN`, `zh_TW.UTF-8`,
    /// `en-GB` and `EN` all count. `None` for other languages (and `C`, `POSIX`, `*`).
    pub fn from_tag(tag: &str) -> Option<Lang> {
        let primary = tag.trim().split(['-', '_', '.', '@']).next().unwrap_or("");
        Lang::NAMES
            .iter()
            .find(|(n, _)| primary.eq_ignore_ascii_case(n))
            .map(|(_, l)| *l)
    }

    /// The language an HTTP `Accept-Language` header prefers among those herald writes:
    /// the supported tag with the highest `q` (the first of equals); `q=0` means "not this".
    /// `None` when no supported language is named (the caller's default applies).
    pub fn from_accept_language(header: &str) -> Option<Lang> {
        let mut best: Option<(u32, Lang)> = None;
        for item in header.split(',') {
            let mut parts = item.split(';');
            let Some(lang) = parts.next().and_then(Lang::from_tag) else {
                continue;
            };
            // q in thousandths; a malformed weight counts as 1 (lenient, as browsers are).
            let q = parts
                .find_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
                .map_or(1000, |q| {
                    q.trim()
                        .parse::<f32>()
                        .map_or(1000, |q| (q.clamp(0.0, 1.0) * 1000.0) as u32)
                });
            if q > 0 && best.is_none_or(|(b, _)| q > b) {
                best = Some((q, lang));
            }
        }
        best.map(|(_, l)| l)
    }
}

#[cfg(test)]
mod tests {
    use super::Lang;

    #[test]
    fn tags_and_locales() {
        for (tag, want) in [
            ("zh", Some(Lang::Zh)),
            ("zh-CN", Some(Lang::Zh)),
            ("ZH-hant-TW", Some(Lang::Zh)),
            ("zh_CN.UTF-8", Some(Lang::Zh)),
            ("en_US.UTF-8", Some(Lang::En)),
            ("en", Some(Lang::En)),
            ("C", None),
            ("C.UTF-8", None),
            ("POSIX", None),
            ("fr-FR", None),
            ("", None),
        ] {
            assert_eq!(Lang::from_tag(tag), want, "{tag:?}");
        }
        assert_eq!(Lang::parse("zh"), Some(Lang::Zh));
        assert_eq!(Lang::parse("zh-CN"), None);
        assert_eq!(Lang::parse("EN"), None);
    }

    #[test]
    fn accept_language_picks_the_best_supported() {
        for (h, want) in [
            ("zh-CN", Some(Lang::Zh)),
            ("zh-CN,zh;q=0.9,en;q=0.8", Some(Lang::Zh)),
            ("en-US,en;q=0.9,zh-CN;q=0.8", Some(Lang::En)),
            ("fr-FR, zh;q=0.5, en;q=0.4", Some(Lang::Zh)),
            ("en;q=0.2, zh;q=0.7", Some(Lang::Zh)),
            ("zh;q=0, en", Some(Lang::En)),
            ("zh;q=0", None),
            ("fr, de", None),
            ("*", None),
            ("", None),
            ("zh;q=abc", Some(Lang::Zh)),
            (";;,,", None),
        ] {
            assert_eq!(Lang::from_accept_language(h), want, "{h:?}");
        }
    }
}
