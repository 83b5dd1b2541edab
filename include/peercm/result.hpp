// Errors as values: Result<T, E> holds either a T or an error code E.
#pragma once

#include <cassert>
#include <utility>
#include <memory>

namespace peercm {

template <class E>
struct Failure {
  E error;
};

// `return fail(Error::x);` converts into any Result<T, Error>.
template <class E>
constexpr Failure<E> fail(E error) {
  return Failure<E>{error};
}

template <class T, class E>
class [[nodiscard]] Result {
 public:
  constexpr Result(T value) : ok_(true), value_(std::move(value)) {}
  constexpr Result(Failure<E> failure) : ok_(false), error_(failure.error) {}
  constexpr Result(const Result& other) : ok_(other.ok_) {
    if (ok_) std::construct_at(&value_, other.value_); else error_ = other.error_;
  }
  constexpr Result(Result&& other) noexcept : ok_(other.ok_) {
    if (ok_) std::construct_at(&value_, std::move(other.value_)); else error_ = other.error_;
  }
  constexpr Result& operator=(Result other) noexcept {
    destroy();
    ok_ = other.ok_;
    if (ok_) std::construct_at(&value_, std::move(other.value_)); else error_ = other.error_;
    return *this;
  }
  constexpr ~Result() { destroy(); }

  constexpr bool has_value() const { return ok_; }
  constexpr explicit operator bool() const { return ok_; }

  constexpr T& value() & { assert(ok_); return value_; }
  constexpr const T& value() const& { assert(ok_); return value_; }
  constexpr T&& value() && { assert(ok_); return std::move(value_); }
  constexpr E error() const { assert(!ok_); return error_; }

  constexpr T& operator*() & { return value(); }
  constexpr const T& operator*() const& { return value(); }
  constexpr T* operator->() { return &value(); }
  constexpr const T* operator->() const { return &value(); }

 private:
  constexpr void destroy() {
    if (ok_) value_.~T();
  }

  bool ok_;
  union {
    T value_;
    E error_;
  };
};

// Success without a value.
template <class E>
class [[nodiscard]] Result<void, E> {
 public:
  constexpr Result() = default;
  constexpr Result(Failure<E> failure) : failed_(true), error_(failure.error) {}

  constexpr bool has_value() const { return !failed_; }
  constexpr explicit operator bool() const { return !failed_; }
  constexpr E error() const { assert(failed_); return error_; }

 private:
  bool failed_ = false;
  E error_{};
};

template <class E>
using Status = Result<void, E>;

}  // namespace peercm
