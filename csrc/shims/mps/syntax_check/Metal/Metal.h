// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the Metal
// interfaces the MPS shim uses, with the signatures, enum values, availability and
// nullability of Apple's headers. Where each comes from (macOS SDK headers as mirrored in
// public repositories, read for issue 27; none of Apple's text is copied):
//   MTLDevice.h: MTLCreateSystemDefaultDevice (__nullable, NS_RETURNS_RETAINED, macOS 10.11),
//     MTLCopyAllDevices (NS_RETURNS_RETAINED, macOS 10.11, not iOS), MTLGPUFamily
//     (NS_ENUM(NSInteger), macOS 10.15; Mac2 = 2002), -supportsFamily: (macOS 10.15),
//     lowPower (getter isLowPower, macOS 10.11), registryID (uint64_t, macOS 10.13),
//     -newCommandQueue (nullable), name;
//     phracker/MacOSX-SDKs MacOSX12.0.sdk Metal.framework/Headers/MTLDevice.h and the same
//     declarations in later SDK mirrors.
//   MTLResource.h: the device property; MTLBuffer.h: length.
//   MTLCommandBuffer.h: MTLCommandBufferStatus values 0-5, commit, waitUntilCompleted,
//     status, error (nullable); MTLCommandQueue.h: commandBuffer.
#pragma once

#import <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

typedef enum : NSUInteger {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
} MTLCommandBufferStatus;

typedef enum : NSInteger {
  MTLGPUFamilyApple7 = 1007,
  MTLGPUFamilyMac2 = 2002,
} MTLGPUFamily API_AVAILABLE(macos(10.15));

@protocol MTLCommandBuffer;
@protocol MTLDevice;

@protocol MTLResource <NSObject>
@property(readonly) id<MTLDevice> device;
@end

@protocol MTLBuffer <MTLResource>
@property(readonly) NSUInteger length;
@end

@protocol MTLCommandQueue <NSObject>
- (nullable id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice <NSObject>
@property(nonnull, readonly) NSString* name;
@property(readonly, getter=isLowPower) BOOL lowPower API_AVAILABLE(macos(10.11));
@property(readonly) uint64_t registryID API_AVAILABLE(macos(10.13));
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily API_AVAILABLE(macos(10.15));
- (nullable id<MTLCommandQueue>)newCommandQueue;
@end

@protocol MTLCommandBuffer <NSObject>
- (void)commit;
- (void)waitUntilCompleted;
@property(readonly) MTLCommandBufferStatus status;
@property(nullable, readonly) NSError* error;
@end

extern "C" id<MTLDevice> _Nullable MTLCreateSystemDefaultDevice(void) API_AVAILABLE(macos(10.11))
    NS_RETURNS_RETAINED;
extern "C" NSArray<id<MTLDevice>>* MTLCopyAllDevices(void) API_AVAILABLE(macos(10.11)) NS_RETURNS_RETAINED;

NS_ASSUME_NONNULL_END
