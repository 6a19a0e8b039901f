// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the
// MetalPerformanceShaders interfaces the MPS shim uses (MPSCoreTypes.h, MPSCommandBuffer.h,
// MPSNDArray.h), with the signatures, enum values and availability Apple documents.
#pragma once

#import <Metal/Metal.h>

typedef enum : uint32_t {
  MPSDataTypeInvalid = 0,
  MPSDataTypeFloatBit = 0x10000000,
  MPSDataTypeFloat32 = MPSDataTypeFloatBit | 32,
  MPSDataTypeFloat16 = MPSDataTypeFloatBit | 16,
  MPSDataTypeSignedBit = 0x20000000,
  MPSDataTypeInt32 = MPSDataTypeSignedBit | 32,
  MPSDataTypeAlternateEncodingBit = 0x80000000,
  MPSDataTypeBFloat16 API_AVAILABLE(macos(14.0)) = MPSDataTypeAlternateEncodingBit | MPSDataTypeFloat16,
} MPSDataType;

typedef NSArray<NSNumber*> MPSShape;

@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
+ (MPSCommandBuffer*)commandBufferFromCommandQueue:(id<MTLCommandQueue>)commandQueue;
@end

@interface MPSNDArrayDescriptor : NSObject
+ (instancetype)descriptorWithDataType:(MPSDataType)dataType shape:(NSArray<NSNumber*>*)shape;
@end

@interface MPSNDArray : NSObject
- (instancetype)initWithDevice:(id<MTLDevice>)device descriptor:(MPSNDArrayDescriptor*)descriptor;
- (instancetype)initWithBuffer:(id<MTLBuffer>)buffer
                        offset:(NSUInteger)offset
                    descriptor:(MPSNDArrayDescriptor*)descriptor API_AVAILABLE(macos(15.0));
- (void)importDataWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                         fromBuffer:(id<MTLBuffer>)buffer
                     sourceDataType:(MPSDataType)sourceDataType
                             offset:(NSUInteger)offset
                         rowStrides:(NSInteger*)rowStrides;
- (void)exportDataWithCommandBuffer:(id<MTLCommandBuffer>)cmdBuf
                           toBuffer:(id<MTLBuffer>)buffer
                destinationDataType:(MPSDataType)destinationDataType
                             offset:(NSUInteger)offset
                         rowStrides:(NSInteger*)rowStrides;
@end
