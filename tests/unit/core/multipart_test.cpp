#include "core/multipart.hpp"

#include <gtest/gtest.h>

#include <string>

#include "api/request.hpp"

namespace weir::core {
namespace {

const std::string kBody =
    "\r\n\n\r"  // (CR and LF before the first delimiter are skipped, as python-multipart does)
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
    "Content-Type: audio/wav\r\n"
    "\r\n"
    "RIFF\r\n--Xy not a delimiter\r\n"
    "--XyZ\r\n"
    "content-disposition: FORM-DATA; name=model\r\n"
    "\r\n"
    "whisper\r\n"
    "--XyZ\r\n"
    "Content-Disposition: form-data; name=\"prompt\"\r\n"
    "\r\n"
    "a; b\r\n"
    "--XyZ--\r\n"
    "epilogue --XyZ--\r\n";

TEST(Multipart, BoundaryFromTheContentType) {
  EXPECT_EQ(form_boundary("multipart/form-data; boundary=abc").value(), "abc");
  EXPECT_EQ(form_boundary("Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b:c\"").value(), "a b:c");
  EXPECT_FALSE(form_boundary("application/json"));
  EXPECT_FALSE(form_boundary("multipart/form-data"));
  EXPECT_FALSE(form_boundary("multipart/form-data; boundary="));
  EXPECT_FALSE(form_boundary("multipart/form-data; boundary=" + std::string(71, 'a')));
  EXPECT_FALSE(form_boundary("multipart/mixed; boundary=abc"));
  EXPECT_FALSE(form_boundary("multipart/form-data; boundary=abc; boundary=xyz"));  // which one would the upstream use?
  EXPECT_EQ(form_boundary("multipart/form-data; xboundary=q; boundary=abc").value(), "abc");
  // Parameters python-multipart (the upstream's parser) splits another way: it reads boundary=PY.
  EXPECT_FALSE(form_boundary(R"(multipart/form-data; x="a\\"; boundary=WEIR; y="; boundary=PY)"));
  // A charset the upstream would decode names and values by, other than UTF-8.
  EXPECT_FALSE(form_boundary("multipart/form-data; boundary=B; charset=utf-7"));
  EXPECT_FALSE(form_boundary("multipart/form-data; boundary=B; charset=\"latin-1\""));
  EXPECT_EQ(form_boundary("multipart/form-data; boundary=B; charset=UTF-8").value(), "B");
  // RFC 2231 forms Python's decode_params joins into boundary / charset (the last wins there).
  for (const char* ct :
       {"multipart/form-data; boundary=W; boundary*=''U", "multipart/form-data; boundary=W; BOUNDARY*=utf-8''U",
        "multipart/form-data; boundary=W; boundary*0=U; boundary*1=S",
        "multipart/form-data; boundary=W; charset*=''utf-16",
        "multipart/form-data; boundary=W; charset*0=latin-; charset*1=1"})
    EXPECT_FALSE(form_boundary(ct)) << ct;
  EXPECT_EQ(form_boundary("multipart/form-data; charset=us-ascii; boundary=B").value(), "B");
}

TEST(Multipart, NoTransportPaddingAfterADelimiter) {
  // python-multipart reads no delimiter in "--B \r\n" and goes on with the part: what Weir would read as
  // the next part is the previous part's value to the upstream.
  EXPECT_FALSE(
      parse_form("--B\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--B \r\n"
                 "Content-Disposition: form-data; name=b\r\n\r\n2\r\n--B--",
                 "B"));
}

TEST(Multipart, PartsWithTheirNamesFilenamesAndValues) {
  auto parts = parse_form(kBody, "XyZ");
  ASSERT_TRUE(parts) << parts.error();
  ASSERT_EQ(parts->size(), 3u);
  const auto& file = (*parts)[0];
  EXPECT_EQ(file.name, "file");
  EXPECT_TRUE(file.has_filename);
  EXPECT_EQ(file.filename, "a.wav");
  EXPECT_EQ(file.content_type, "audio/wav");
  EXPECT_EQ(file.value, "RIFF\r\n--Xy not a delimiter");
  EXPECT_EQ((*parts)[1].name, "model");
  EXPECT_FALSE((*parts)[1].has_filename);
  EXPECT_EQ((*parts)[1].value, "whisper");
  EXPECT_EQ(find_part(*parts, "prompt")->value, "a; b");
  EXPECT_EQ(find_part(*parts, "language"), nullptr);
}

TEST(Multipart, BareLineFeedsOrCarriageReturnsInHeadsAreRefused) {
  // python-multipart (vLLM's form parser) ends a header line only at CRLF and keeps a bare LF in the
  // value, where a second name="model" is the field it keeps: Weir read "x" and authorized by "base".
  EXPECT_FALSE(parse_form("--b\nContent-Disposition: form-data; name=\"x\"\n\n1\r\n--b--", "b"));
  EXPECT_FALSE(
      parse_form("--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nbase\r\n--b\r\n"
                 "Content-Disposition: form-data; name=\"x\"\nX: y; name=\"model\"\r\n\r\nsecret\r\n--b--",
                 "b"));
  EXPECT_FALSE(
      parse_form("--b\r\nContent-Disposition: form-data; name=\"x\"\rX: name=\"model\"\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\n1\r\n--b--", "b"));
  auto parts = parse_form("--b\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\n1\n2\r\n--b--", "b");
  ASSERT_TRUE(parts) << parts.error();  // (a value may hold any bytes)
  EXPECT_EQ((*parts)[0].value, "1\n2");
}

TEST(Multipart, MalformedBodiesAreErrors) {
  EXPECT_FALSE(parse_form("", "b"));
  EXPECT_FALSE(parse_form("no boundary here", "b"));
  // No close delimiter.
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1", "b"));
  // A head that never ends.
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: form-data; name=x", "b"));
  // Not form-data, no disposition, a header line without a colon.
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: attachment\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form("--b\r\nContent-Type: text/plain\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form("--b\r\nbogus\r\n\r\n1\r\n--b--", "b"));
  // A second name, a name* the upstream would decode, two dispositions: refused.
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: form-data; name=a; name=model\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form("--b\r\nContent-Disposition: form-data; name*=UTF-8''model\r\n\r\n1\r\n--b--", "b"));
  // RFC 2231 continuations, which Python's email parser joins into `name` (python-multipart 0.0.20 keeps the
  // last name): a part Weir saw unnamed was `model` upstream.
  for (const char* p : {"name*0=\"model\"", "name*0*=UTF-8''model", "NAME*1=\"x\"", "name*0=\"mo\"; name*1=\"del\"",
                        "name=\"x\"; name*0=\"model\""})
    EXPECT_FALSE(parse_form(std::string("--b\r\nContent-Disposition: form-data; ") + p + "\r\n\r\n1\r\n--b--", "b"))
        << p;
  EXPECT_FALSE(parse_form(
      "--b\r\nContent-Disposition: form-data; name=a\r\nContent-Disposition: form-data; name=model\r\n\r\n1\r\n--b--",
      "b"));
  // Content-Disposition read as vLLM's form parser reads it: python-multipart's parse_options_header through
  // Python's email.message before 0.0.30 (the names below are what Python 3.11 gives), its own _parseparam
  // since (0.0.34 gives the same): a \" outside quotes is no quote, a bare `name` is an empty name. Where the
  // two differ, the part is refused (Weir cannot know which the upstream runs): <v> loses its brackets only
  // in the first, Latin-1 NBSP or VT is whitespace only in the first. A second name is refused.
  struct Case {
    const char* params;
    const char* name;  // nullptr: refused
    bool file;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"name=\"x\"; a=\\\"; name=\"model\"", nullptr, false},
           {"name=\"note\"; a=\\\"; name=\"model\"", nullptr, false},
           {"name=\"x\"; name", nullptr, false},
           {"name=<model>", nullptr, false},
           {"name=<stream>; filename=\"a\"", nullptr, true},
           {"name=\"mo\\\"del\"", "mo\"del", false},
           {"name=\"model", "\"model", false},
           {"name=mo del", "mo del", false},
           {"name=\"x\"; filename=\"C:\\a.wav\"", "x", true},
           {"name=\"file\"; filename=\"back\\\\slash.wav\"", "file", true},
           {"name=\"file\"; filename=\"it\\\"s.wav\"", "file", true},
           {"name=\"a;b\"", "a;b", false},
           {"NAME=\"Up\"", "Up", false},
           {"\xa0name=\"nb\"", nullptr, false},
           {"name=\"model\"\xa0", nullptr, false},
           {"name=model\x0b", nullptr, false},
           {"name=\"model\" \t", "model", false},
           {"name=\"<x>\"", "<x>", false},
           {"name=\"a\\\\\"; filename=\"q\"", "a\"; filename=\"q", false},
       }) {
    auto parts =
        parse_form(std::string("--b\r\nContent-Disposition: form-data; ") + c.params + "\r\n\r\n1\r\n--b--", "b");
    if (c.name == nullptr) {
      EXPECT_FALSE(parts) << c.params;
      continue;
    }
    ASSERT_TRUE(parts) << c.params << ": " << parts.error();
    EXPECT_EQ((*parts)[0].name, c.name) << c.params;
    EXPECT_EQ((*parts)[0].has_filename, c.file) << c.params;
  }
  // A header name is a token: python-multipart 0.0.30 and later refuse the body for a space before the colon.
  for (const char* h : {"Content-Disposition : form-data; name=model", "Content-Disposition\t: form-data; name=model",
                        " Content-Disposition: form-data; name=model", "Content Disposition: form-data; name=model",
                        "X-A b: 1\r\nContent-Disposition: form-data; name=model", ": form-data; name=model"})
    EXPECT_FALSE(parse_form(std::string("--b\r\n") + h + "\r\n\r\n1\r\n--b--", "b")) << h;
  EXPECT_TRUE(parse_form("--b\r\ncontent-disposition:form-data; name=model\r\nX-Y_z.1: v\r\n\r\n1\r\n--b--", "b"));
  // filename* alone makes a file part.
  auto f =
      parse_form("--b\r\nContent-Disposition: form-data; name=file; filename*=UTF-8''a.wav\r\n\r\n1\r\n--b--", "b");
  ASSERT_TRUE(f);
  EXPECT_TRUE((*f)[0].has_filename);
  f = parse_form("--b\r\nContent-Disposition: form-data; name=file; filename*0=\"a.wav\"\r\n\r\n1\r\n--b--", "b");
  ASSERT_TRUE(f);
  EXPECT_TRUE((*f)[0].has_filename);
  EXPECT_EQ((*f)[0].name, "file");
  // Junk after a delimiter.
  EXPECT_FALSE(parse_form("--bjunk\r\n", "b"));
  std::string many;
  for (int i = 0; i < 3; ++i) many += "--b\r\nContent-Disposition: form-data; name=x\r\n\r\n1\r\n";
  many += "--b--";
  EXPECT_TRUE(parse_form(many, "b", 3));
  EXPECT_FALSE(parse_form(many, "b", 2));
}

// A preamble is refused: python-multipart (vLLM's form parser) skips CR and LF before the first delimiter
// and reads from there, so a part behind "\n--b\r\n" (a prompt, stream=true) was the upstream's and not
// Weir's, which skipped to the first CRLF-delimiter.
TEST(Multipart, NoPreambleButLeadingLineEnds) {
  const std::string form =
      "--b\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n"
      "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--";
  for (const char* lead : {"\n", "\r", "\r\n\n", "\n\r\n\r\n"}) {
    auto parts = parse_form(lead + form, "b");
    ASSERT_TRUE(parts) << parts.error();
    ASSERT_EQ(parts->size(), 2u);
    EXPECT_EQ((*parts)[0].name, "stream");
  }
  for (const char* lead : {"preamble\r\n", " \r\n", "x", "\t"}) {
    auto parts = parse_form(lead + form, "b");
    ASSERT_FALSE(parts) << lead;
    EXPECT_NE(parts.error().find("preamble"), std::string::npos) << parts.error();
  }
}

// Parameters are split in one pass (a ';' inside quotes is looked at once, not once per ';' before it:
// 256 KiB of them took minutes), and a header with more than 32 parameters is refused.
TEST(Multipart, HeadersAreReadInLinearTimeWithBoundedParameters) {
  std::string name(256 * 1024, ';');
  auto parts = parse_form("--b\r\nContent-Disposition: form-data; name=\"x" + name + "\"\r\n\r\n1\r\n--b--", "b");
  ASSERT_TRUE(parts) << parts.error();
  EXPECT_EQ((*parts)[0].name, "x" + name);
  std::string many = "--b\r\nContent-Disposition: form-data; name=x";
  for (int i = 0; i < 31; ++i) many += "; a=b";
  EXPECT_TRUE(parse_form(many + "\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form(many + "; a=b\r\n\r\n1\r\n--b--", "b"));
  EXPECT_FALSE(parse_form(
      "--b\r\nContent-Disposition: form-data; name=x" + std::string(100000, ';') + "\r\n\r\n1\r\n--b--", "b"));
  std::string ct = "multipart/form-data; boundary=b";
  for (int i = 0; i < 40; ++i) ct += "; a=b";
  EXPECT_FALSE(form_boundary(ct));
  EXPECT_TRUE(form_boundary("multipart/form-data; charset=utf-8; x=\"" + std::string(60000, ';') + "\"; boundary=b"));
}

TEST(Multipart, ReplaceAndAppendKeepTheRestByteForByte) {
  auto parts = parse_form(kBody, "XyZ");
  ASSERT_TRUE(parts);
  std::string out;
  replace_part_value(kBody, *find_part(*parts, "model"), "openai/whisper-large-v3", out);
  auto again = parse_form(out, "XyZ");
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(find_part(*again, "model")->value, "openai/whisper-large-v3");
  EXPECT_EQ(find_part(*again, "file")->value, find_part(*parts, "file")->value);
  EXPECT_EQ(out.size(), kBody.size() - 7 + 23);

  append_form_field(kBody, "XyZ", parts->back(), "stream_include_usage", "true", out);
  again = parse_form(out, "XyZ");
  ASSERT_TRUE(again) << again.error();
  ASSERT_EQ(again->size(), 4u);
  EXPECT_EQ(again->back().name, "stream_include_usage");
  EXPECT_EQ(again->back().value, "true");
  EXPECT_EQ(find_part(*again, "prompt")->value, "a; b");
  EXPECT_TRUE(out.ends_with("--XyZ--\r\nepilogue --XyZ--\r\n"));
}

std::string form(const std::string& fields) { return fields + "--B--\r\n"; }
std::string field(const std::string& name, const std::string& value) {
  return "--B\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n";
}
const std::string kFile = "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.wav\"\r\n\r\nRIFF\r\n";
constexpr std::string_view kType = "multipart/form-data; boundary=B";

TEST(AudioRequest, ModelStreamAndPrompt) {
  auto f = api::parse_audio_request(
      kType, form(kFile + field("model", "whisper") + field("stream", "True") + field("prompt", "hello")));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->model, "whisper");
  EXPECT_TRUE(f->stream);
  EXPECT_FALSE(f->include_usage);
  EXPECT_EQ(f->prompt_bytes, 5u);
  f = api::parse_audio_request(kType, form(kFile + field("stream", "1") + field("stream_include_usage", "on")));
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->model.empty());  // the default pool's
  EXPECT_TRUE(f->include_usage);
}

TEST(AudioRequest, BadFormsAreClientErrorsNamingTheField) {
  auto e = api::parse_audio_request("application/json", "{}");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().status, 400);
  e = api::parse_audio_request(kType, form(field("model", "whisper")));
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().param, "file");
  // An empty model is vLLM's served model (the default pool's), as in a JSON body.
  e = api::parse_audio_request(kType, form(kFile + field("model", "")));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->model, "");
  e = api::parse_audio_request(kType, form(kFile + field("stream", "maybe")));
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().param, "stream");
  e = api::parse_audio_request(kType, form(kFile + field("model", "cheap") + field("model", "dear")));
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().param, "model");
  e = api::parse_audio_request(kType, "--B\r\ngarbage");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.error().status, 400);
}

}  // namespace
}  // namespace weir::core
