// Which Redis error replies are about one key's data (that scope's sync
// fails, no outage) and which are about Redis (an outage): the messages as
// Redis 7 sends them, also relayed from inside a script.
#include <gtest/gtest.h>

#include "admission/redis_errors.hpp"
#include "store/redis_client.hpp"

namespace weir::admission {
namespace {

TEST(RedisKeyDataErrorTest, ErrorsAboutOneKeysDataAreNoOutage) {
  for (const char* m : {
           "WRONGTYPE Operation against a key holding the wrong kind of value",
           "WRONGTYPE Operation against a key holding the wrong kind of value script: "
           "2e9dc1eee79fed50b6f3a9088fab7b81cb333123, on @user_script:1.",
           "ERR hash value is not an integer",
           "ERR hash value is not an integer script: d7883d5fa62c008be57eef0e30675303e01a5bd9, on @user_script:1.",
           "ERR value is not an integer or out of range",
           "ERR hash value is not a valid float",
           "ERR increment or decrement would overflow",
           "ERR user_script:1: attempt to perform arithmetic on local 'x' (a nil value) script: "
           "66cc3998d021b32b66d04d550d9f2ff1c183ab5a, on @user_script:1.",
           "ERR Error running script (call to f_0123): @user_script:12: user_script:12: attempt to compare "
           "number with nil",
       })
    EXPECT_TRUE(key_data_error(m)) << m;
}

TEST(RedisKeyDataErrorTest, ErrorsAboutRedisAreAnOutage) {
  for (const char* m : {
           "OOM command not allowed when used memory > 'maxmemory'.",
           "OOM command not allowed when used memory > 'maxmemory'. script: abc, on @user_script:20.",
           "READONLY You can't write against a read only replica.",
           "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
           "LOADING Redis is loading the dataset in memory",
           "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
           "NOAUTH Authentication required.",
           "NOPERM this user has no permissions to access one of the keys used as arguments",
           "NOPERM this user has no permissions to run the 'evalsha' command",
           "WRONGPASS invalid username-password pair or user is disabled.",
           "NOREPLICAS Not enough good replicas to write.",
           "NOSCRIPT No matching script. Please use EVAL.",
           "ERR unknown command 'EVALSHA', with args beginning with: ",
           // Redis 7 relays an ACL refusal inside a script as an ERR (regression helper, stop 54): the user
           // cannot do the limiter's work for any key.
           "ERR The user executing the script can't run this command or subcommand script: 0123abcd, on "
           "@user_script:12.",
           "ERR The user executing the script can't access at least one of the keys mentioned in the command "
           "script: 0123abcd, on @user_script:7.",
           "ERR Error running script (call to f_0123): @user_script:9: @user_script: 9: The user executing the "
           "script can't run this command or subcommand",
           // Redis 6 relays an error of redis.call() inside the script's own.
           "ERR Error running script (call to f_0123): @user_script:9: -OOM command not allowed when used memory "
           "> 'maxmemory'.",
           "ERR Error running script (call to f_0123): @user_script:9: @user_script: 9: -READONLY You can't write "
           "against a read only replica.",
           "no reply within 250 ms",
           "cannot connect to Redis: Connection refused",
           "connection to Redis lost: closed by server",
           "",
       })
    EXPECT_FALSE(key_data_error(m)) << m;
}

// Replies that say the server cannot take commands at all (a replica: the old master after a failover): the
// client drops the connection, and the next one resolves the host again (stop 57).
TEST(RedisWrongServerTest, ReplicasAndClusterRedirectsAreTheWrongServer) {
  for (const char* m : {
           "READONLY You can't write against a read only replica.",
           "READONLY You can't write against a read only replica. script: 0123abcd, on @user_script:20.",
           "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
           "MOVED 3999 127.0.0.1:6381",
           "ASK 3999 127.0.0.1:6381",
           "ERR Error running script (call to f_0123): @user_script:9: @user_script: 9: -READONLY You can't write "
           "against a read only replica.",
       }) {
    EXPECT_TRUE(store::wrong_server_reply(m)) << m;
    EXPECT_FALSE(key_data_error(m)) << m;  // and an outage
  }
  for (const char* m : {
           "LOADING Redis is loading the dataset in memory",  // the right server, about to serve
           "OOM command not allowed when used memory > 'maxmemory'.",
           "NOREPLICAS Not enough good replicas to write.",
           "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.",
           "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
           "NOPERM this user has no permissions to run the 'evalsha' command",
           "WRONGTYPE Operation against a key holding the wrong kind of value",
           "ERR hash value is not an integer",
           "READONLYX not a code Redis sends",
           "ASKING",
           "ERR wrong number of arguments: READONLYish",
           "",
       })
    EXPECT_FALSE(store::wrong_server_reply(m)) << m;
}

// Replies that refuse the connection itself (stop 61): a failed connection attempt, backed off, never a
// connection that served (NOAUTH reset the backoff to 50 ms: 12-16 reconnections a second).
TEST(RedisRefusedTest, AuthAndMaxclientsRefuseTheConnection) {
  for (const char* m : {
           "NOAUTH Authentication required.",
           "WRONGPASS invalid username-password pair or user is disabled.",
           "ERR max number of clients reached",
       }) {
    EXPECT_TRUE(store::refused_reply(m)) << m;
    EXPECT_FALSE(store::wrong_server_reply(m)) << m;
    EXPECT_FALSE(key_data_error(m)) << m;
  }
  for (const char* m : {
           "NOPERM this user has no permissions to run the 'info' command",  // one command refused
           "NOAUTHX not a code Redis sends",
           "ERR unknown command 'EVALSHA'",
           "OOM command not allowed when used memory > 'maxmemory'.",
           "ERR Error running script (call to f_0123): @user_script:9: max number of clients reached",
           "",
       })
    EXPECT_FALSE(store::refused_reply(m)) << m;
}

}  // namespace
}  // namespace weir::admission
