//! The default kind name of an artifact type.

/// `PendingAction` → `pending_action`, `HTTPRequest` → `http_request`, `Order2` → `order2`.
/// A raw identifier's `r#` is dropped.
pub(crate) fn snake_case(type_name: &str) -> String {
    let name = type_name.strip_prefix("r#").unwrap_or(type_name);
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next = chars.get(i + 1).copied();
            let starts_word = match prev {
                None | Some('_') => false,
                Some(p) => {
                    p.is_lowercase() || p.is_ascii_digit() || (p.is_uppercase() && next.is_some_and(char::is_lowercase))
                }
            };
            if starts_word {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::snake_case;

    #[test]
    fn converts_type_names() {
        assert_eq!(snake_case("Order"), "order");
        assert_eq!(snake_case("PendingAction"), "pending_action");
        assert_eq!(snake_case("HTTPRequest"), "http_request");
        assert_eq!(snake_case("SendHTTP"), "send_http");
        assert_eq!(snake_case("Order2Line"), "order2_line");
        assert_eq!(snake_case("Already_Snake"), "already_snake");
        assert_eq!(snake_case("r#Type"), "type");
    }
}
