// URLs as Weir shows them: in logs, start-up messages and configuration
// errors, never with the secrets a URL can carry.
#pragma once

#include <string>
#include <string_view>

namespace weir::core {

// `url` with its secrets taken out, for display (RFC 3986 §3 syntax,
// scheme://userinfo@host:port/path?query#fragment, read textually so any
// string works, an unparsable one too):
//  - userinfo ("user:pass@") is dropped, the '@' with it;
//  - the value of every query parameter whose name is credential-like
//    (is_secret_query_param) becomes REDACTED, other parameters are kept;
//  - a non-empty fragment becomes REDACTED (it is never sent, and OAuth
//    implicit flows put tokens there).
// Without "://" the text before the first '/', '?' or '#' is taken as the
// authority, so "user:pass@host" loses its userinfo too. A URL without
// secrets comes back unchanged, byte for byte.
// Examples: "http://u:p@h:80/?api_key=s&x=1" -> "http://h:80/?api_key=REDACTED&x=1".
std::string redact_url(std::string_view url);

// True when `name` (a query parameter's or a JSON member's, as written:
// percent-encoded, any case) names a credential: after percent-decoding and
// lower-casing it is one of key, apikey, api_key, api-key, token,
// access_token, sig, signature, password, passwd, pwd, passphrase, secret,
// auth (Firebase's query credential), jwt, authkey, accesskey, secretkey,
// privatekey, apitoken, accesstoken, authtoken, sessionid, sessiontoken,
// authorization, credential(s), cookie, or ends in one of key, apikey,
// token, sig, signature, password, passwd, pwd, passphrase, secret, jwt,
// authorization, credential(s), cookie right after a '-', '_' or '.'
// (x-api-key, client_secret, refresh_token, X-Amz-Signature,
// X-Amz-Security-Token, db.password, db_pwd, Proxy-Authorization,
// aws_credentials, set-cookie) or as a camelCase word (accessToken,
// clientSecret, privateKey, googleCredentials; not monkey or passkey);
// with up to 4 digits after it, and a '-', '_' or '.' before them, too
// (apikey2, key_1, password-01, clientSecret2). is_secret_query_param
// takes the same numbers (code_1).
// Only the last kSecretParamTail bytes of a longer name decide (it is too
// long to be one of the names, and a suffix's decoded characters lie in
// them), so the check costs O(1) whatever the name's length: the request
// log's redaction calls it for every quote of a body.
bool is_secret_param(std::string_view name);
inline constexpr std::size_t kSecretParamTail = 64;

// A URL query parameter's name that names a credential: is_secret_param's,
// and the names real providers take credentials under in a query but that
// are too common as JSON members to redact there: code (Azure Functions'
// function key), pass, session. redact_url uses it.
bool is_secret_query_param(std::string_view name);

}  // namespace weir::core
