//! Which language a request wants its texts for people in: `?lang=` first, then the
//! `Accept-Language` header; `None` leaves it to the task's own `lang` (default `en`).

use hyper::Request;

use super::input::query_one;
use super::problem::Problem;
use crate::model::Lang;

/// `?lang=` takes a language tag (`en`, `zh`, `zh-CN`, ...); one herald does not write is 422
/// naming `lang`, and `lang` given twice is 400 naming it. An `Accept-Language` without a supported language is no error: the default
/// applies, as a browser's list is not the user's choice of this page.
pub fn wanted<B>(req: &Request<B>) -> Result<Option<Lang>, Problem> {
    // Given twice is 400 naming `lang`, as any parameter a route reads (docs/API.md).
    let given = query_one(req.uri().query().unwrap_or(""), "lang")?;
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
        assert_eq!(w("/v1/tasks?lang=zh&lang=zh", None), Err(400));
        assert_eq!(w("/v1/tasks?lang=en&limit=1&lang=zh", None), Err(400));
        // Other parameters are the route's to judge, repeated or not.
        assert_eq!(w("/v1/channels?_=1&_=2&lang=zh", None), Ok(Some(Lang::Zh)));
    }
}
