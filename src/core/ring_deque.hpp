// A FIFO with indexed access over one circular buffer, for the work queues of a queue pair.
// std::deque allocates and frees a block as a steady stream of work requests passes through
// it, and its indexing divides; here a queue that has reached its working depth allocates
// nothing more, and an index is a mask. The buffer starts empty (an idle queue pair holds
// no slots), doubles when full, and is released when the queue drains after growing past
// kKeptCapacity, so a burst does not pin its memory for the queue pair's life.
// Unlike std::deque's, its elements move when it grows: a push invalidates every pointer and
// reference into it, so whatever outlives a push keeps a sequence number, not an address.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace peercm::core {

template <typename T>
class RingDeque {
 public:
  static constexpr std::size_t kFirstCapacity = 4;
  static constexpr std::size_t kKeptCapacity = 64;

  RingDeque() = default;
  RingDeque(RingDeque&& other) noexcept
      : slots_(std::exchange(other.slots_, nullptr)),
        capacity_(std::exchange(other.capacity_, 0)),
        head_(std::exchange(other.head_, 0)),
        size_(std::exchange(other.size_, 0)) {}
  RingDeque& operator=(RingDeque&& other) noexcept {
    if (this != &other) {
      release();
      slots_ = std::exchange(other.slots_, nullptr);
      capacity_ = std::exchange(other.capacity_, 0);
      head_ = std::exchange(other.head_, 0);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  RingDeque(const RingDeque&) = delete;
  RingDeque& operator=(const RingDeque&) = delete;
  ~RingDeque() { release(); }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t capacity() const { return capacity_; }

  T& operator[](std::size_t i) { return slots_[(head_ + i) & (capacity_ - 1)]; }
  const T& operator[](std::size_t i) const { return slots_[(head_ + i) & (capacity_ - 1)]; }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }

  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == capacity_) grow();
    T* slot = slots_ + ((head_ + size_) & (capacity_ - 1));
    // An aggregate is built with braces: clang 14 (the fuzz preset) lacks C++20's
    // parenthesized aggregate initialization, which construct_at would need.
    if constexpr (std::is_aggregate_v<T>)
      ::new (static_cast<void*>(slot)) T{std::forward<Args>(args)...};
    else
      std::construct_at(slot, std::forward<Args>(args)...);
    ++size_;
    return *slot;
  }
  void push_back(T value) { emplace_back(std::move(value)); }

  void pop_front() {
    std::destroy_at(slots_ + head_);
    head_ = (head_ + 1) & (capacity_ - 1);
    if (--size_ == 0) {
      head_ = 0;
      if (capacity_ > kKeptCapacity) release();
    }
  }

  // Destroys every element and releases the buffer.
  void clear() { release(); }

  // Front to back, as std::deque iterates.
  template <typename Self>
  class Iterator {
   public:
    Iterator(Self* ring, std::size_t i) : ring_(ring), i_(i) {}
    auto& operator*() const { return (*ring_)[i_]; }
    auto* operator->() const { return &(*ring_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& other) const { return i_ == other.i_; }

   private:
    Self* ring_;
    std::size_t i_;
  };
  Iterator<RingDeque> begin() { return {this, 0}; }
  Iterator<RingDeque> end() { return {this, size_}; }
  Iterator<const RingDeque> begin() const { return {this, 0}; }
  Iterator<const RingDeque> end() const { return {this, size_}; }

 private:
  // Only when full (size_ == capacity_): the old slots are all taken, from head_ round.
  void grow() {
    const std::size_t old_capacity = capacity_;
    const std::size_t capacity = old_capacity == 0 ? kFirstCapacity : old_capacity * 2;
    T* slots = std::allocator<T>().allocate(capacity);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      T* from = slots_ + ((head_ + i) & (old_capacity - 1));
      std::construct_at(slots + i, std::move(*from));
      std::destroy_at(from);
    }
    if (slots_ != nullptr) std::allocator<T>().deallocate(slots_, old_capacity);
    slots_ = slots;
    capacity_ = capacity;
    head_ = 0;
  }
  void release() {
    for (std::size_t i = 0; i < size_; ++i) std::destroy_at(&(*this)[i]);
    if (slots_ != nullptr) std::allocator<T>().deallocate(slots_, capacity_);
    slots_ = nullptr;
    capacity_ = 0;
    head_ = 0;
    size_ = 0;
  }

  T* slots_ = nullptr;
  std::size_t capacity_ = 0;  // 0 or a power of two
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace peercm::core
