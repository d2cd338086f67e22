#include "core/ip_net.hpp"

#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

namespace weir::core {

namespace {
constexpr std::array<std::uint8_t, 12> kMappedPrefix{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
}  // namespace

bool IpAddress::v4() const noexcept { return std::memcmp(bytes.data(), kMappedPrefix.data(), 12) == 0; }

bool IpNet::contains(const IpAddress& a) const noexcept {
  if (v6_only && a.v4()) return false;
  const std::size_t whole = prefix / 8;
  if (std::memcmp(a.bytes.data(), base.bytes.data(), whole) != 0) return false;
  const unsigned rest = prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (a.bytes[whole] & mask) == base.bytes[whole];
}

std::optional<IpAddress> parse_ip(std::string_view text) noexcept {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
    if (text.find(':') == std::string_view::npos) return std::nullopt;  // brackets hold an IPv6 address only
  }
  // inet_pton reads a C string: a copy on the stack (no address is longer than 45 characters).
  std::array<char, 64> z{};
  if (text.empty() || text.size() >= z.size() || text.find('\0') != std::string_view::npos) return std::nullopt;
  std::memcpy(z.data(), text.data(), text.size());
  IpAddress a;
  if (text.find(':') == std::string_view::npos) {
    std::memcpy(a.bytes.data(), kMappedPrefix.data(), 12);
    if (::inet_pton(AF_INET, z.data(), a.bytes.data() + 12) != 1) return std::nullopt;
  } else if (::inet_pton(AF_INET6, z.data(), a.bytes.data()) != 1) {
    return std::nullopt;
  }
  return a;
}

std::optional<IpNet> parse_ip_net(std::string_view text, std::string& error) {
  const auto slash = text.find('/');
  const auto addr = parse_ip(text.substr(0, slash));
  if (!addr || text.starts_with('[')) {
    error = "expected an IP address or a CIDR block (ADDRESS/LENGTH), e.g. 10.0.0.0/8 or fd00::/8";
    return std::nullopt;
  }
  IpNet net{.base = *addr, .prefix = 128};
  // Written in IPv4 form: the prefix counts from bit 96 of the mapped form. Written in IPv6 form (an
  // IPv4-mapped one too, ::ffff:10.0.0.0/104): from bit 0.
  const bool v4_text = text.substr(0, slash).find(':') == std::string_view::npos;
  if (slash != std::string_view::npos) {
    const std::string_view len = text.substr(slash + 1);
    const unsigned max = v4_text ? 32 : 128;
    unsigned n = 0;
    bool ok = !len.empty() && len.size() <= 3;
    for (const char c : len) {
      if (c < '0' || c > '9') ok = false;
      n = n * 10 + static_cast<unsigned>(c - '0');
    }
    if (!ok || n > max) {
      error = fmt::format("the prefix length must be a number from 0 to {}", max);
      return std::nullopt;
    }
    net.prefix = static_cast<std::uint8_t>(v4_text ? n + 96 : n);
  }
  // An IPv6 block wider than the mapped range, or outside it, holds no IPv4 address.
  net.v6_only = !v4_text && !(net.prefix >= 96 && addr->v4());
  // Bits past the prefix cleared, so contains() compares bytes as they are.
  for (unsigned bit = net.prefix; bit < 128; ++bit)
    net.base.bytes[bit / 8] = static_cast<std::uint8_t>(net.base.bytes[bit / 8] & ~(0x80u >> (bit % 8)));
  return net;
}

std::size_t format_ip(const IpAddress& a, IpText& out) noexcept {
  const char* text = a.v4() ? ::inet_ntop(AF_INET, a.bytes.data() + 12, out.data(), out.size())
                            : ::inet_ntop(AF_INET6, a.bytes.data(), out.data(), out.size());
  return text ? std::strlen(text) : 0;
}

}  // namespace weir::core
