//! The language the CLI asks herald for (`Accept-Language`) and writes `herald next` in:
//! `--lang en|zh`, else the locale (`LC_ALL`, `LC_MESSAGES`, `LANG`, the first one set, as
//! POSIX orders them). Pure: the environment is passed in.

use super::client::CliError;
use crate::model::Lang;

/// `None`: neither the flag nor the locale names a language herald writes (herald's default,
/// or the task's own language, applies). An unknown `--lang` is an error; an unsupported
/// locale is not (it is the machine's setting, not a request).
pub fn choose(
    flag: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Lang>, CliError> {
    if let Some(f) = flag {
        return Lang::from_tag(f).map(Some).ok_or_else(|| {
            CliError::Local(format!("--lang: unknown language {f:?}; expected en or zh"))
        });
    }
    let locale = ["LC_ALL", "LC_MESSAGES", "LANG"]
        .into_iter()
        .find_map(|k| env(k).filter(|v| !v.is_empty()));
    Ok(locale.as_deref().and_then(Lang::from_tag))
}

/// [`choose`] with the process's environment.
pub fn from_env(flag: Option<&str>) -> Result<Option<Lang>, CliError> {
    choose(flag, |k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn flag_then_locale_in_posix_order() {
        let c = |flag, vars: &[(&str, &str)]| choose(flag, env(vars)).ok().flatten();
        assert_eq!(c(Some("zh"), &[("LANG", "en_US.UTF-8")]), Some(Lang::Zh));
        assert_eq!(c(Some("en"), &[("LANG", "zh_CN.UTF-8")]), Some(Lang::En));
        assert_eq!(c(None, &[("LANG", "zh_CN.UTF-8")]), Some(Lang::Zh));
        assert_eq!(
            c(None, &[("LANG", "zh_CN.UTF-8"), ("LC_ALL", "en_US.UTF-8")]),
            Some(Lang::En)
        );
        assert_eq!(
            c(
                None,
                &[("LANG", "en_US.UTF-8"), ("LC_MESSAGES", "zh_TW.UTF-8")]
            ),
            Some(Lang::Zh)
        );
        // An empty LC_ALL does not count; C and other languages leave it to herald.
        assert_eq!(
            c(None, &[("LC_ALL", ""), ("LANG", "zh_CN")]),
            Some(Lang::Zh)
        );
        assert_eq!(c(None, &[("LANG", "C.UTF-8")]), None);
        assert_eq!(c(None, &[("LANG", "fr_FR.UTF-8")]), None);
        assert_eq!(c(None, &[]), None);
        assert!(choose(Some("fr"), env(&[])).is_err());
    }
}
