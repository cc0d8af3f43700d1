//! Which language a request wants its texts for people in: `?lang=` first, then the
//! `Accept-Language` header; `None` leaves it to the task's own `lang` (default `en`).

use hyper::Request;

use super::input::percent_decode;
use super::problem::Problem;
use crate::model::Lang;

/// `?lang=` takes a language tag (`en`, `zh`, `zh-CN`, ...); one herald does not write is 422
/// naming `lang`. An `Accept-Language` without a supported language is no error: the default
/// applies, as a browser's list is not the user's choice of this page.
pub fn wanted<B>(req: &Request<B>) -> Result<Option<Lang>, Problem> {
    let query = req.uri().query().unwrap_or("");
    let given = query
        .split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .find(|(k, _)| *k == "lang")
        .map(|(_, v)| percent_decode(v).unwrap_or_else(|| v.to_string()));
    if let Some(v) = given.filter(|v| !v.is_empty()) {
        return match Lang::from_tag(&v) {
            Some(l) => Ok(Some(l)),
            None => Err(Problem::invalid(
                "lang",
                format!("unknown language {v:?}; expected en or zh"),
            )),
        };
    }
    Ok(req
        .headers()
        .get(hyper::header::ACCEPT_LANGUAGE)
        .and_then(|h| h.to_str().ok())
        .and_then(Lang::from_accept_language))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, accept: Option<&str>) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        if let Some(a) = accept {
            b = b.header("accept-language", a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn query_wins_over_the_header() {
        let w = |uri, a| wanted(&req(uri, a)).map_err(|p| p.status.as_u16());
        assert_eq!(w("/v1/tasks", None), Ok(None));
        assert_eq!(w("/v1/tasks?lang=zh", None), Ok(Some(Lang::Zh)));
        assert_eq!(w("/v1/tasks?limit=5&lang=zh-CN", None), Ok(Some(Lang::Zh)));
        assert_eq!(w("/v1/tasks?lang=en", Some("zh-CN")), Ok(Some(Lang::En)));
        assert_eq!(w("/v1/tasks", Some("zh-CN,zh;q=0.9")), Ok(Some(Lang::Zh)));
        assert_eq!(w("/v1/tasks?lang=", Some("zh")), Ok(Some(Lang::Zh)));
        assert_eq!(w("/v1/tasks", Some("fr")), Ok(None));
        assert_eq!(w("/v1/tasks?lang=fr", None), Err(422));
    }
}
