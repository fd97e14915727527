//! Errors as one line for people: tonic's and hyper's say little at the top
//! ("transport error") and the cause beneath often repeats its parent's words.

/// `e` and its causes, `: `-separated, a cause that repeats the one above it said
/// once ("tcp connect error: tcp connect error: refused" reads "tcp connect error:
/// refused").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if text != last {
            out.push_str(": ");
            out.push_str(&text);
            last = text;
        }
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    fn layers(texts: &[&'static str]) -> Layer {
        let (last, rest) = texts.split_last().unwrap();
        rest.iter().rev().fold(Layer(last, None), |inner, t| {
            Layer(t, Some(Box::new(inner)))
        })
    }

    #[test]
    fn causes_follow_the_error_and_a_repeated_one_is_said_once() {
        let e = layers(&[
            "transport error",
            "tcp connect error",
            "tcp connect error",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            chain(&e),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
        assert_eq!(chain(&layers(&["alone"])), "alone");
        // Only a cause that repeats the one right above it is dropped.
        assert_eq!(chain(&layers(&["a", "b", "a"])), "a: b: a");
    }
}
