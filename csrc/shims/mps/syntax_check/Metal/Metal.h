// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the Metal
// interfaces the MPS shim uses, with the signatures and enum values Apple documents.
#pragma once

#import <Foundation/Foundation.h>

typedef enum : NSUInteger {
  MTLCommandBufferStatusNotEnqueued = 0,
  MTLCommandBufferStatusEnqueued = 1,
  MTLCommandBufferStatusCommitted = 2,
  MTLCommandBufferStatusScheduled = 3,
  MTLCommandBufferStatusCompleted = 4,
  MTLCommandBufferStatusError = 5,
} MTLCommandBufferStatus;

@protocol MTLCommandBuffer;

@protocol MTLResource <NSObject>
@end

@protocol MTLBuffer <MTLResource>
@property(readonly) NSUInteger length;
@end

@protocol MTLCommandQueue <NSObject>
- (id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice <NSObject>
@property(readonly) NSString* name;
- (id<MTLCommandQueue>)newCommandQueue;
@end

@protocol MTLCommandBuffer <NSObject>
- (void)commit;
- (void)waitUntilCompleted;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
@end

extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;
